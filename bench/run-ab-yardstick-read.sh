#!/usr/bin/env bash
# Two builds of spillway-server on the yardstick's capped read, loaded at the same time: both on
# their default flags (a log line per request), the yardstick's 50 MiB printable-text object and
# its load generator (bloadgen, 8 connections each, 100,000-byte JSON pages at random offsets).
# Each round prints both servers' reads/s and CPU per read. Loaded together, both see the same
# machine: its speed, which moves by tens of percent from one minute to the next here, cancels
# out of the CPU per read (the reads/s split between the two is left to the scheduler).
# Usage: bench/run-ab-yardstick-read.sh BASE_BINARY [HEAD_BINARY]   Env: ROUNDS=6, SECS=6,
# YARDSTICK=../shared/bench
set -euo pipefail
cd "$(dirname "$0")/.."
base=$1
head=${2:-target/release/spillway-server}
[ -x "$head" ] || cargo build --release -q -p spillway-server
rounds=${ROUNDS:-6}
secs=${SECS:-6}
# shellcheck source=bench/yardstick.sh
. bench/yardstick.sh
work=/tmp/spillway-ab-yardstick
yardstick_read_setup $work ab-obj
"$base" --listen 127.0.0.1:17841 --data-dir $work/base --metrics-listen none > $work/base.log 2>&1 &
pa=$!
"$head" --listen 127.0.0.1:17842 --data-dir $work/head --metrics-listen none > $work/head.log 2>&1 &
pb=$!
trap 'kill $pa $pb 2>/dev/null; wait $pa $pb 2>/dev/null || true' EXIT
digest=
for name in base head; do
  port=$([ $name = base ] && echo 17841 || echo 17842)
  for _ in $(seq 100); do [ -f $work/$name/token ] && curl -sf -o /dev/null http://127.0.0.1:$port/healthz && break; sleep 0.1; done
  printf 'Authorization: Bearer %s\n' "$(cat $work/$name/token)" > $work/$name.headers
  digest=$(curl -sf -X POST -H @$work/$name.headers --data-binary @$work/obj http://127.0.0.1:$port/v1/blobs |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["digest"])')
done
load() { # port, seconds, name
  "$bloadgen" range --addr 127.0.0.1:$1 --url "/v1/blobs/$digest/read?offset={offset}&limit=100000" --size $((50 << 20)) \
    --len 100000 --conns 8 --duration "$2" --json-length 1 --expect-status 200 --header-file $work/$3.headers
}
ticks() { awk '{print $14 + $15}' /proc/$1/stat; }
load 17841 2 base > /dev/null & w=$!; load 17842 2 head > /dev/null; wait $w
for round in $(seq "$rounds"); do
  ta=$(ticks $pa); tb=$(ticks $pb)
  load 17841 "$secs" base > $work/base.json & w=$!; load 17842 "$secs" head > $work/head.json; wait $w
  python3 - $work/base.json $work/head.json "$ta" "$(ticks $pa)" "$tb" "$(ticks $pb)" "$round" <<'PY'
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
t = [float(x) / 100 for x in sys.argv[3:7]]
ua, ub = (t[1] - t[0]) / a["requests"] * 1e6, (t[3] - t[2]) / b["requests"] * 1e6
print(json.dumps({"round": int(sys.argv[7]), "base_rps": round(a["rps"]), "base_us_per_read": round(ua, 1),
                  "head_rps": round(b["rps"]), "head_us_per_read": round(ub, 1), "head_over_base_cpu": round(ub / ua, 3)}))
PY
done
