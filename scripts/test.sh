#!/usr/bin/env bash
# The whole test suite: formatting, lints, and every test. CI (.ci/run) calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace --release
# A short fuzzing run of the NBD codec where the toolchain allows (cargo fuzz needs nightly).
if cargo +nightly --version >/dev/null 2>&1 && cargo fuzz --version >/dev/null 2>&1; then
  (cd fuzz && cargo +nightly fuzz run nbd_codec -- -max_total_time=60)
else
  echo "fuzz: skipped (needs a nightly toolchain and cargo-fuzz); the same driver runs in crates/salsa-nbd/tests/codec.rs"
fi
