#!/bin/bash
# Server CPU of 1 MiB sequential rewrites, round by round: a fresh 1 GiB pool file written with
# zeros, `salsa serve` on it, one fill of the volume, then ROUNDS rounds of five passes of 1 MiB
# writes at QD 8 (fio's nbd engine), with IDLE seconds between rounds. Prints, per round, the
# server's CPU time (user + system, all threads, in ticks of 10 ms; the destager thread's share
# in brackets) and fio's bandwidth (KB/s).
# Shows what a write-buffer destage during the writes costs against rounds without one.
#
# Usage: scripts/seq_rounds.sh [--salsa BIN] [--port N] [--rounds 4] [--idle 0] [--dir DIR] [-- SERVE-ARGS...]
set -euo pipefail
BIN=target/release/salsa; PORT=10941; ROUNDS=4; IDLE=0; DIR=seq-rounds
while [ $# -gt 0 ]; do
  case "$1" in
    --salsa) BIN=$2; shift 2 ;;
    --port) PORT=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --idle) IDLE=$2; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$DIR"; rm -f "$DIR/pool.img"
dd if=/dev/zero of="$DIR/pool.img" bs=1M count=1024 oflag=direct status=none
"$BIN" serve --device "$DIR/pool.img:1G" --listen "127.0.0.1:$PORT" "$@" 2>"$DIR/serve.log" &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null || true' EXIT
URI="nbd://127.0.0.1:$PORT/default"
for _ in $(seq 100); do nbdinfo --size "$URI" >/dev/null 2>&1 && break; sleep 0.1; done
VOL=$(nbdinfo --size "$URI")
ticks() { awk '{print $14 + $15}' "/proc/$PID/stat"; }
# The destager thread's share (its writes of buffered pages into the log).
destager_ticks() {
  for t in /proc/$PID/task/*; do
    [ "$(cat "$t/comm" 2>/dev/null)" = salsa-destage ] && awk '{print $14 + $15}' "$t/stat" && return
  done
  echo 0
}
pass() { fio --name=w --ioengine=nbd --uri="$URI" --rw=write --bs=1M --iodepth=8 --size="$VOL" "$@" \
  --output-format=terse 2>/dev/null | grep -v connected | cut -d';' -f48; }
pass >/dev/null
for r in $(seq "$ROUNDS"); do
  t0=$(ticks); d0=$(destager_ticks); bw=$(pass --loops=5); t1=$(ticks); d1=$(destager_ticks)
  echo "round $r: server CPU $((t1 - t0)) ticks (destager $((d1 - d0))), $bw KB/s"
  sleep "$IDLE"
done
