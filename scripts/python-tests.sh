#!/usr/bin/env bash
# Builds the `salsa` Python package (crates/salsa-py, with maturin, into a virtualenv under the
# cargo target directory) and runs its tests with pytest. scripts/test.sh calls it; run it
# alone to work on the bindings.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
mkdir -p "$target"
venv=$(cd "$target" && pwd)/py-venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check "maturin>=1.5,<2" "pytest>=7"
(cd crates/salsa-py && VIRTUAL_ENV="$venv" "$venv/bin/maturin" develop --release -q)
# Its temporary files under the target directory (pytest empties --basetemp at each start), so
# the suite leaves nothing in the system's temporary directory.
"$venv/bin/pytest" -q -p no:cacheprovider --basetemp="$(cd "$target" && pwd)/pytest-tmp" crates/salsa-py/tests "$@"
