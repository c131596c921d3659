#!/usr/bin/env bash
# An agent paging through a log it has never read: byte pages of a fresh 50 MB log read in
# order by following `next_offset` (one connection), then the same pages twice more — on a
# server with the text cache (`--text-cache-bytes`, the default) and one without (`0`),
# interleaved, with the server's CPU time per page. A block is escaped when a second page
# starts in it: the first pass reads as without the cache, the second escapes the blocks, the
# third reads them from memory.
# Usage: bench/run-pages.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/common.sh
. bench/common.sh
bench_setup pages
start() { # name, port, text cache bytes
  SPILLWAY_DATA_DIR="$work/$1" SPILLWAY_LISTEN=127.0.0.1:$2 SPILLWAY_METRICS_LISTEN=none SPILLWAY_TEXT_CACHE_BYTES=$3 RUST_LOG=warn \
    target/release/spillway-server >"$work/$1.log" 2>&1 &
  echo $!
}
cached=$(start cached 17803 268435456)
plain=$(start plain 17804 0)
trap 'kill $cached $plain 2>/dev/null; wait 2>/dev/null' EXIT
wait_ready "$work/cached" 17803
wait_ready "$work/plain" 17804
run() { # name, port, pid, label, op args...
  local name=$1 port=$2 pid=$3 label=$4; shift 4
  SPILLWAY_TOKEN=$(cat "$work/$name/token") with_cpu "$pid" $load --target spillway --url "http://127.0.0.1:$port" --label "$label" "$@"
}
for round in 1 2 3; do
  for name in cached plain; do
    port=$([ $name = cached ] && echo 17803 || echo 17804); pid=$([ $name = cached ] && echo "$cached" || echo "$plain")
    log=$(SPILLWAY_TOKEN=$(cat "$work/$name/token") $load --target spillway --url "http://127.0.0.1:$port" seed --size 1300000 --lines)
    run $name "$port" "$pid" "$name first pass r$round" pages --name "$log"
    run $name "$port" "$pid" "$name second pass r$round" pages --name "$log"
    run $name "$port" "$pid" "$name third pass r$round" pages --name "$log"
  done
done
