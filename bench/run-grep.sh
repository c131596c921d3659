#!/usr/bin/env bash
# Grep of a 300,000-line log (12 MB) on one server, 4 connections, with the server's CPU time
# per request: a pattern on every line (each answer is a page of matches, capped at 100 KB of
# text), the same with two lines of context on each side, and a pattern found once (the whole
# blob scanned); beside each, GNU grep on the same bytes in a local file (`grep -n`, piped to
# `head -c 100000` where the answer is a page), one process after another.
# SPILLWAY_SERVER_BIN= another build for before/after.
# Usage: bench/run-grep.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/common.sh
. bench/common.sh
bench_setup grep
start_spillway "$work/spw" 17748
S="$load --target spillway --url http://127.0.0.1:17748"
log=$($S seed --size 300000 --lines)
run() { # label, query, count
  with_cpu "$spw" $S --concurrency 4 --label "$1" grep --name "$log" --query "$2" --count "$3"
}
curl -sf -H "Authorization: Bearer $SPILLWAY_TOKEN" "http://127.0.0.1:17748/v1/blobs/$log" -o "$work/log.txt"
local_grep() { # label, count, command...
  local label=$1 count=$2; shift 2
  local t0; t0=$(date +%s%N)
  for _ in $(seq "$count"); do "$@" >/dev/null; done
  python3 -c "import json,sys; print(json.dumps({'label': sys.argv[1], 'requests': int(sys.argv[2]), 'mean_ms': round(int(sys.argv[3]) / 1e6 / int(sys.argv[2]), 2)}))" \
    "$label" "$count" "$(( $(date +%s%N) - t0 ))"
}
page() { grep -n "$@" "$work/log.txt" | head -c 100000 || true; } # grep ends on SIGPIPE
for round in 1 2 3; do
  run "grep: every line r$round" "pattern=log" 200
  local_grep "GNU grep: every line r$round" 200 page log
  run "grep: every line, 2 lines of context r$round" "pattern=log&before=2&after=2" 200
  local_grep "GNU grep: every line, 2 lines of context r$round" 200 page -C2 log
  run "grep: one line r$round" "pattern=line%20%20%20%20123456%20" 100
  local_grep "GNU grep: one line r$round" 100 grep -n "line    123456 " "$work/log.txt"
done
