#!/usr/bin/env bash
# The yardstick's capped read, measured and profiled on its own: the release server on its default
# flags, the yardstick's 50 MiB object (printable-ASCII lines, made by its bench.py) and its load
# generator (bloadgen: 16 blocking connections, 100,000-byte JSON pages at random offsets, each
# body kept and its "length" read, as `ratio-vs-nginx` runs it). Prints req/s, the server's CPU
# per read, the CPU and context switches of each server thread, and with PERF=1 the frames by
# self time and, from DWARF call graphs, by time under them (ours and the kernel's).
# Usage: bench/profile-yardstick-read.sh [server binary]   Env: SECS=8, PERF=1, YARDSTICK=../shared/bench
# Needs perf (Debian: linux-perf) for PERF=1.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/spillway-server}
[ -x "$bin" ] || cargo build --release -q -p spillway-server
secs=${SECS:-8}
# shellcheck source=bench/yardstick.sh
. bench/yardstick.sh
work=/tmp/spillway-prof-yardstick
yardstick_read_setup $work profile-obj
"$bin" --listen 127.0.0.1:17831 --data-dir $work/d > $work/log 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -f $work/d/token ] && curl -sf -o /dev/null http://127.0.0.1:17831/healthz && break; sleep 0.1; done
printf 'Authorization: Bearer %s\n' "$(cat $work/d/token)" > $work/headers
digest=$(curl -sf -X POST -H @$work/headers --data-binary @$work/obj http://127.0.0.1:17831/v1/blobs |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["digest"])')
load() {
  "$bloadgen" range --addr 127.0.0.1:17831 --url "/v1/blobs/$digest/read?offset={offset}&limit=100000" \
    --size $((50 << 20)) --len 100000 --conns 16 --duration "$1" --json-length 1 --expect-status 200 --header-file $work/headers
}
load 3 > /dev/null
ticks() { awk '{print $14 + $15}' /proc/$pid/stat; }
perfpid=
if [ -n "${PERF:-}" ]; then
  perf record -F 999 --call-graph dwarf,16384 -p $pid -o $work/perf.data -- sleep "$secs" > /dev/null 2>&1 &
  perfpid=$!
fi
t0=$(ticks)
out=$(load "$secs")
t1=$(ticks)
[ -z "$perfpid" ] || wait $perfpid
for t in /proc/$pid/task/*; do
  printf '%s cpu_s=%s voluntary=%s involuntary=%s\n' "$(cat $t/comm)" "$(awk '{printf "%.2f", ($14 + $15) / 100}' $t/stat)" \
    "$(awk '/^voluntary_ctxt/ {print $2}' $t/status)" "$(awk '/^nonvoluntary_ctxt/ {print $2}' $t/status)"
done | sort -t= -k2 -rn | head -6
python3 - "$out" "$t0" "$t1" <<'PY'
import json, sys
d, t0, t1 = json.loads(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
cpu = (t1 - t0) / 100
print(f"{d['rps']:.0f} req/s, server CPU {cpu / d['requests'] * 1e6:.1f} us per read, {cpu / d['elapsed_s']:.2f} cores, "
      f"p50 {d['p50_us'] / 1000:.2f} ms, p99 {d['p99_us'] / 1000:.2f} ms")
PY
if [ -n "$perfpid" ]; then
  echo "-- by self time"
  perf report -i $work/perf.data --no-children --percent-limit 1 --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -25
  echo "-- by time under a frame (inlined frames and the runtime's own left out)"
  perf report -i $work/perf.data --children --percent-limit 0.8 --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' |
    grep -v 'inlined\|catch_unwind\|call_once\|do_call\|tokio::runtime\|std::sys\|start_thread\|clone3' | awk '$1 + 0 < 50' | cut -c1-180 | head -60
fi
