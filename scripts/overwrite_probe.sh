#!/usr/bin/env bash
# Overwrite probe: one server, one run, each phase's throughput and what the pool did in it.
#
#   scripts/overwrite_probe.sh [--dir DIR] [--binary PATH] [-- SERVE-OPTIONS...]
#
# Serves a fresh 1 GiB pool file in DIR (default ./overwrite-probe) with `salsa serve
# --read-cache 0` and, over NBD with fio's nbd engine: fills the volume with 1 MiB writes,
# writes 4 KiB random blocks at queue depth 32 for 10 s, then makes three 5 s passes of 1 MiB
# sequential writes at queue depth 8. After each phase it prints fio's MB/s and the change in
# the pool's counters (bytes written to the devices, flushes, syncs, time in syncs, GC
# relocations and cleaned segments, metadata bytes, discards). Single runs: a tool for
# finding where time goes, not for ratios (scripts/bench_nbd.py measures those, alternating
# servers, with medians).
set -euo pipefail

dir=overwrite-probe
binary=target/release/salsa
while [[ $# -gt 0 ]]; do
    case "$1" in
        --dir) dir=$2; shift 2 ;;
        --binary) binary=$2; shift 2 ;;
        --) shift; break ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "overwrite_probe.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
command -v fio >/dev/null || { echo "overwrite_probe.sh: fio is missing (scripts/install-deps.sh installs it)" >&2; exit 1; }
[[ -x "$binary" ]] || { echo "overwrite_probe.sh: no salsa binary at $binary (cargo build --release)" >&2; exit 1; }

rm -rf "$dir"
mkdir -p "$dir"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$binary" serve --device "$dir/pool.img:1G" --control "$dir/pool.ctl" --read-cache 0 \
    --listen "127.0.0.1:$port" "$@" >"$dir/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 100); do
    [[ -S "$dir/pool.ctl" ]] && break
    sleep 0.1
done
[[ -S "$dir/pool.ctl" ]] || { echo "overwrite_probe.sh: the server did not start:" >&2; cat "$dir/serve.log" >&2; exit 1; }

uri="nbd://127.0.0.1:$port/default"
stats() { "$binary" stats --control "$dir/pool.ctl" --json; }
before=$(stats)
phase() {
    local name=$1; shift
    local mbps
    mbps=$(fio --name="$name" --ioengine=nbd --uri="$uri" --group_reporting --minimal "$@" |
        awk -F';' '$48 != "" {printf "%.1f", $48 / 1024}')
    local after
    after=$(stats)
    python3 - "$name" "$mbps" "$before" "$after" <<'EOF'
import json, sys
name, mbps, a, b = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
d = lambda k: b.get(k, 0) - a.get(k, 0)
print(f"{name:<8} {mbps:>8} MB/s  device {d('device_bytes_written') / 1e6:7.0f} MB  flushes {d('flushes'):>7}  syncs {d('syncs'):>6} "
      f"({d('sync_micros') / 1e3:8.0f} ms)  GC moved {d('gc_bytes_relocated') / 1e6:7.0f} MB "
      f"({d('gc_segments_cleaned'):>5} segments)  metadata {d('metadata_bytes_written') / 1e6:5.1f} MB  "
      f"discarded {d('discarded_bytes') / 1e6:6.0f} MB (skipped {d('discards_skipped')})")
EOF
    before=$after
}
phase fill --rw=write --bs=1M --iodepth=8 --size=100%
phase random --rw=randwrite --bs=4k --iodepth=32 --time_based --runtime=10
for pass in 1 2 3; do
    phase "seq$pass" --rw=write --bs=1M --iodepth=8 --time_based --runtime=5
done
