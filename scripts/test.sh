#!/usr/bin/env bash
# The whole test suite: formatting, lints, and every test. CI (.ci/run) calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace --release
