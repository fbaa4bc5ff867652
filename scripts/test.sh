#!/usr/bin/env bash
# The whole test suite: formatting, lints, and every test. CI (.ci/run) calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# The libraries' documentation (salsa-core's facade above all) builds without a broken link or
# a public page that points into private code.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --lib
cargo test --workspace --release
# The Python bindings: built with maturin, tested with pytest (Python policies among them).
scripts/python-tests.sh
# A short fuzzing run of the NBD codec (libFuzzer with AddressSanitizer). cargo fuzz passes
# unstable compiler flags (-Zsanitizer): a nightly toolchain is used when there is one, else the
# stable compiler with RUSTC_BOOTSTRAP=1, which accepts them (the stable toolchain ships the
# sanitizer runtimes). Only the fuzz harness is built that way; the project builds on stable.
# Then the decoders of the on-disk structures and compressed pages (what a damaged or foreign
# device holds), for half as long.
FUZZ_SECONDS=${SALSA_FUZZ_SECONDS:-60}
for target in nbd_codec:$FUZZ_SECONDS on_disk:$((FUZZ_SECONDS / 2)); do
  name=${target%%:*}; seconds=${target##*:}
  if cargo +nightly --version >/dev/null 2>&1; then
    (cd fuzz && cargo +nightly fuzz run "$name" -- -max_total_time="$seconds")
  else
    (cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run "$name" -- -max_total_time="$seconds")
  fi
  echo "fuzz: $name ran ${seconds} s without a failure"
done
