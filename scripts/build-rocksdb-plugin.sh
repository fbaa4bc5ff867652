#!/usr/bin/env bash
# Builds the RocksDB plugin (plugins/rocksdb/salsa_fs.cc) against Debian's librocksdb-dev and
# libsalsa.so: target/release/librocksdb_salsa.so. Load it into any RocksDB tool with
# LD_PRELOAD and name the file system by URI (see the source's head):
#   LD_PRELOAD=target/release/librocksdb_salsa.so db_bench --fs_uri=salsa://VOLUME@DEVICE ...
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh >/dev/null
cargo build --release -q -p salsa-capi
out=target/release/librocksdb_salsa.so
lib=$(pwd)/target/release
if [ ! -e "$out" ] || [ "$out" -ot plugins/rocksdb/salsa_fs.cc ] || [ "$out" -ot "$lib/libsalsa.so" ]; then
  c++ -std=c++17 -O2 -g -fPIC -shared -Wall -Wextra -Werror \
    -Icrates/salsa-capi/include plugins/rocksdb/salsa_fs.cc \
    -L"$lib" -lsalsa -lrocksdb -Wl,-rpath,"$lib" -o "$out"
fi
echo "$out"
