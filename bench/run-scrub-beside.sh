#!/usr/bin/env bash
# The capped read beside the background scrub (api.md v1.3: p99 at most 1.2x without): p50/p99 of
# 100 KB capped reads (16 connections, 10 s, random offsets of a 50 MB log) on a store that also
# holds SIZE_MB (default 1024) of raw outputs, the server started with no background scrub
# ("alone") and then with `--scrub-interval 1` (a 24th of the store every 1/24 s: the scrub never
# rests but to give way to requests), ROUNDS rounds (default 3) alternated, on the same data.
# Usage: bench/run-scrub-beside.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh
bench_setup scrub-beside
out="$work/results.jsonl"
: > "$out"
rounds=${ROUNDS:-3}
port=17931
start_spillway "$work/data" $port
S="$load --target spillway --url http://127.0.0.1:$port"
log=$($S seed --size 1300000 --lines)
size=$(curl -sI -H "Authorization: Bearer $SPILLWAY_TOKEN" "http://127.0.0.1:$port/v1/blobs/$log" | awk 'tolower($1)=="content-length:" {print $2+0}')
for _ in $(seq $(( ${SIZE_MB:-1024} / 64 ))); do $S seed --size $((64 << 20)) > /dev/null; done
sync
restart() { # restart SCRUB_INTERVAL
  kill "$spw"; wait "$spw" 2>/dev/null || true
  SPILLWAY_SCRUB_INTERVAL=$1 SPILLWAY_COMPACT_AFTER=100000000 start_spillway "$work/data" $port
}
for r in $(seq "$rounds"); do
  restart 0
  $S --concurrency 16 --label "alone $r" range --name "$log" --size "$size" --secs 10 | tee -a "$out"
  restart 1
  sleep 1
  $S --concurrency 16 --label "scrub $r" range --name "$log" --size "$size" --secs 10 | tee -a "$out"
  curl -s "http://127.0.0.1:$port/healthz" > /dev/null
done
python3 - "$out" <<'PY'
import json, sys
rows = {r["label"]: r for r in (json.loads(l) for l in open(sys.argv[1]) if l.strip())}
print("| round | alone p50 / p99 (ms) | beside the background scrub p50 / p99 (ms) | p99 ratio | reads/s alone / beside |")
print("|---|---|---|---|---|")
for k in sorted(k for k in rows if k.startswith("alone ")):
    r = k.split()[1]
    a, s = rows[k], rows[f"scrub {r}"]
    print(f"| {r} | {a['p50_ms']} / {a['p99_ms']} | {s['p50_ms']} / {s['p99_ms']} | {s['p99_ms'] / a['p99_ms']:.2f}x | {a['req_per_s']} / {s['req_per_s']} |")
PY
