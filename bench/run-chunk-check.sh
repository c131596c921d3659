#!/usr/bin/env bash
# What checking compacted chunks costs a capped read (api.md v1.3: at most 1.1x without): two
# builds of the server, with the check (HEAD, default this tree's release build) and without it
# (BASE), each on a fresh store holding a 50 MB log compacted into chunks, read with 100 KB
# capped reads at random offsets (16 connections, 10 s) with the text cache off and a 1 MiB
# chunk cache, so that nearly every read decompresses the chunks it touches; the server's CPU per
# read of each, ROUNDS rounds (default 3), builds alternated.
# Usage: bench/run-chunk-check.sh BASE_BINARY [HEAD_BINARY]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh
base=$1
head=${2:-target/release/spillway-server}
bench_setup chunk-check
rounds=${ROUNDS:-3}
port=17941
one() { # one LABEL BINARY
  local dir="$work/$1" bin=$2
  rm -rf "$dir"
  SPILLWAY_SERVER_BIN=$bin start_spillway "$dir" $port
  local S="$load --target spillway --url http://127.0.0.1:$port"
  local log size
  log=$($S seed --size 1300000 --lines)
  size=$(curl -sI -H "Authorization: Bearer $SPILLWAY_TOKEN" "http://127.0.0.1:$port/v1/blobs/$log" | awk 'tolower($1)=="content-length:" {print $2+0}')
  kill "$spw"; wait "$spw" 2>/dev/null || true
  SPILLWAY_DATA_DIR="$dir" RUST_LOG=warn "$bin" compact > /dev/null
  SPILLWAY_TEXT_CACHE_BYTES=0 SPILLWAY_READ_CACHE_BYTES=1048576 SPILLWAY_SERVER_BIN=$bin start_spillway "$dir" $port
  with_cpu "$spw" $S --concurrency 16 --label "$1" range --name "$log" --size "$size" --secs 10
  kill "$spw"; wait "$spw" 2>/dev/null || true
  spw= started=()
}
out="$work/results.jsonl"
: > "$out"
for r in $(seq "$rounds"); do
  one "unchecked-$r" "$base" | tee -a "$out"
  one "checked-$r" "$head" | tee -a "$out"
done
python3 - "$out" <<'PY'
import json, sys
rows = {r["label"]: r for r in (json.loads(l) for l in open(sys.argv[1]) if l.strip())}
print("| round | CPU per read without the check (us) | with it (us) | ratio | reads/s without / with |")
print("|---|---|---|---|---|")
for k in sorted(k for k in rows if k.startswith("unchecked-")):
    r = k.split("-")[1]
    a, b = rows[k], rows[f"checked-{r}"]
    print(f"| {r} | {a['server_cpu_us_per_req']} | {b['server_cpu_us_per_req']} | "
          f"{b['server_cpu_us_per_req'] / a['server_cpu_us_per_req']:.2f}x | {a['req_per_s']} / {b['req_per_s']} |")
PY
