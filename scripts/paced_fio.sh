#!/usr/bin/env bash
# Paced writes over NBD: `salsa serve --pace-writes` under fio's random 4 KiB writes.
#
#   scripts/paced_fio.sh [--dir DIR] [--rounds N] [--size SIZE] BINARY...
#
# For each round, for each salsa BINARY in turn (two builds alternate, for an A/B on one
# machine): serves a fresh pool file of SIZE (default 512M) in DIR (default ./paced-fio) with
# `--pace-writes --read-cache 0`, fills 400 MiB of the volume with 1 MiB writes, warms up with
# 5 s of random 4 KiB writes at queue depth 32, then measures 15 s of the same with fio's nbd
# engine. Prints one line per run: MB/s, completion latency p50/p99/p99.9/max (us), and the
# writes the pool paced in the measured run.
set -euo pipefail

dir=paced-fio
rounds=1
size=512M
binaries=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --dir) dir=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --size) size=$2; shift 2 ;;
        -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
        -*) echo "paced_fio.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) binaries+=("$1"); shift ;;
    esac
done
[[ ${#binaries[@]} -gt 0 ]] || { echo "paced_fio.sh: name at least one salsa binary (see --help)" >&2; exit 2; }
command -v fio >/dev/null || { echo "paced_fio.sh: fio is missing (scripts/install-deps.sh installs it)" >&2; exit 1; }

one_run() {
    local binary=$1
    rm -rf "$dir"
    mkdir -p "$dir"
    local port
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    "$binary" serve --device "$dir/pool.img:$size" --control "$dir/pool.ctl" --read-cache 0 \
        --listen "127.0.0.1:$port" --pace-writes >"$dir/serve.log" 2>&1 &
    local server=$!
    for _ in $(seq 100); do
        [[ -S "$dir/pool.ctl" ]] && break
        sleep 0.1
    done
    [[ -S "$dir/pool.ctl" ]] || { echo "paced_fio.sh: the server did not start:" >&2; cat "$dir/serve.log" >&2; kill $server; exit 1; }
    local uri="nbd://127.0.0.1:$port/default"
    fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 --size=400M >/dev/null
    fio --name=warm --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=32 --size=400M \
        --time_based --runtime=5 >/dev/null
    local before
    before=$("$binary" stats --control "$dir/pool.ctl" --json)
    fio --name=rand --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=32 --size=400M \
        --time_based --runtime=15 --output-format=json >"$dir/fio.json"
    local after
    after=$("$binary" stats --control "$dir/pool.ctl" --json)
    kill $server
    wait $server 2>/dev/null || true
    python3 - "$binary" "$dir/fio.json" "$before" "$after" <<'PY'
import json, sys
binary, path, a, b = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
text = open(path).read()
w = json.loads(text[text.index("{"):])["jobs"][0]["write"]  # fio's nbd engine prints a line first
p = w["clat_ns"]["percentile"]
us = lambda k: p[k] / 1000
print(f"{binary}: {w['bw_bytes'] / 1e6:.1f} MB/s, p50 {us('50.000000'):.0f} us, p99 {us('99.000000'):.0f} us, "
      f"p99.9 {us('99.900000'):.0f} us, max {w['clat_ns']['max'] / 1000:.0f} us, "
      f"paced {b['paced_writes'] - a['paced_writes']} writes")
PY
}

for _ in $(seq "$rounds"); do
    for b in "${binaries[@]}"; do
        one_run "$b"
    done
done
