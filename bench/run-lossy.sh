#!/usr/bin/env bash
# Capped 100 KB reads of random bytes (every page is lossy: invalid UTF-8 replaced, control
# bytes escaped) against the same reads of a text log, interleaved on one server, 16
# connections, with the server's CPU time per request. The issue's bar: lossy within 2× of text.
# Usage: bench/run-lossy.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/common.sh
. bench/common.sh
bench_setup lossy
start_spillway "$work/spw" 17747
S="$load --target spillway --url http://127.0.0.1:17747"
text=$($S seed --size 1300000 --lines)
binary=$($S seed --size 50000000)
run() { # label, name
  with_cpu "$spw" $S --concurrency 16 --label "$1" range --name "$2" --size 50000000 --secs 10
}
for round in 1 2 3; do
  run "text capped 100 KB read r$round" "$text"
  run "random bytes capped 100 KB read r$round" "$binary"
done
