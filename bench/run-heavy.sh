#!/usr/bin/env bash
# A heavy request never stalls the rest: p50/p99 of 100 KB capped reads (16 connections, 10 s, at
# random offsets of a 50 MB log) and of 4 KiB PUTs (16 connections) with nothing else running,
# then beside 4 clients grepping a 50 MB line-dense log (1.3 M lines) for a pattern on 9 lines in
# 10, then beside 2 clients downloading 1 GiB blobs whole (one each), back to back; ROUNDS rounds
# (default 3), each workload against its own "alone" of the same round. Release server on the
# embedded default with its default flags (SPILLWAY_SERVER_BIN another build).
# Usage: bench/run-heavy.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/common.sh
. bench/common.sh
bench_setup heavy
out="$work/results.jsonl"
: > "$out"
say() { echo "$1" | tee -a "$out"; }
rounds=${ROUNDS:-3}
start_spillway "$work/data" 17921
S="$load --target spillway --url http://127.0.0.1:17921"
log=$($S seed --size 1300000 --lines)
size=$(curl -sI -H "Authorization: Bearer $SPILLWAY_TOKEN" "http://127.0.0.1:17921/v1/blobs/$log" | awk 'tolower($1)=="content-length:" {print $2+0}')
big=($($S seed --size 1073741824) $($S seed --size 1073741824))
# The 2 GiB just written go to the disk now, not 30 s later (the kernel's dirty expiry) in the
# middle of a measured run, where the 4 KiB PUTs' fsyncs would wait behind them.
sync
beside=()
stop_beside() { kill "${beside[@]}" 2>/dev/null; wait "${beside[@]}" 2>/dev/null || true; beside=(); }
measure() { # measure KIND ROUND
  say "$($S --concurrency 16 --label "$1 capped read $2" range --name "$log" --size "$size" --secs 10)"
  say "$($S --concurrency 16 --label "$1 4 KiB PUT $2" put --size 4096 --count 20000)"
}
# Unmeasured: the first 20,000 small uploads go into empty tables, cheaper than any after them, so
# round 1's "alone" would be measured on a smaller database than what it is compared with.
$S --concurrency 16 --label warm-up put --size 4096 --count 20000 > /dev/null
for r in $(seq "$rounds"); do
  measure alone "$r"
  # A pattern on 9 lines in 10: lines whose number does not end in 0 (`[1-9] `).
  $S --concurrency 4 --label grepping grep --name "$log" --query "pattern=%5B1-9%5D%20" --count 1000000 > /dev/null &
  beside=($!)
  sleep 1
  measure grep "$r"
  stop_beside
  for b in "${big[@]}"; do
    $S --concurrency 1 --label downloading get --name "$b" --count 1000000 > /dev/null &
    beside+=($!)
  done
  sleep 1
  measure get "$r"
  stop_beside
done
python3 - "$out" <<'PY'
import json, sys
rows = {r["label"]: r for r in (json.loads(l) for l in open(sys.argv[1]) if l.strip())}
print("| workload, round | alone p50 / p99 (ms) | beside 4 greps p50 / p99 (ms) | p99 ratio | beside 2 GETs of 1 GiB p50 / p99 (ms) | p99 ratio |")
print("|---|---|---|---|---|---|")
for w in ("capped read", "4 KiB PUT"):
    for k in sorted(k for k in rows if k.startswith(f"alone {w} ")):
        r = k.rsplit(" ", 1)[1]
        a, g, d = rows[k], rows[f"grep {w} {r}"], rows[f"get {w} {r}"]
        print(f"| {w}, {r} | {a['p50_ms']} / {a['p99_ms']} | {g['p50_ms']} / {g['p99_ms']} | {g['p99_ms'] / a['p99_ms']:.2f}x "
              f"| {d['p50_ms']} / {d['p99_ms']} | {d['p99_ms'] / a['p99_ms']:.2f}x |")
PY
