#!/usr/bin/env bash
# Two builds of spillway-server side by side, interleaved in one run, with each server's CPU per
# request. `read` (the default): capped 100 KB reads at random offsets (16 connections) and line
# pages at line 1 and 999,000. `put`: uploads of 1 MiB (sequential) and 16 MiB (8 connections).
# `get`: full downloads of a 50 MB log. `small`: uploads of 4 KiB (16 connections), each new.
# Usage: bench/run-ab.sh BASE_BINARY [read|put|get|small]   (BASE: e.g. a release build of an earlier commit)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/common.sh
. bench/common.sh
base=$1
mode=${2:-read}
bench_setup ab
start() { # name, binary, port
  SPILLWAY_DATA_DIR="$work/$1" SPILLWAY_LISTEN=127.0.0.1:$3 SPILLWAY_METRICS_LISTEN=none RUST_LOG=warn "$2" >"$work/$1.log" 2>&1 &
  echo $!
}
a=$(start base "$base" 17801)
b=$(start head target/release/spillway-server 17802)
trap 'kill $a $b 2>/dev/null; wait 2>/dev/null' EXIT
wait_ready "$work/base" 17801
wait_ready "$work/head" 17802
out="$work/results.jsonl"
: > "$out"
run() { # name, port, op args...: the load generator's JSON line, plus the server's CPU per request
  local name=$1 port=$2; shift 2
  local pid; pid=$([ "$name" = base ] && echo "$a" || echo "$b")
  SPILLWAY_TOKEN=$(cat "$work/$name/token") with_cpu "$pid" $load --target spillway --url "http://127.0.0.1:$port" "$@" | tee -a "$out"
}
if [ "$mode" = put ]; then
  for round in $(seq 1 "${ROUNDS:-3}"); do
    for name in base head; do
      port=$([ $name = base ] && echo 17801 || echo 17802)
      sync
      run $name "$port" --label "$name PUT 1 MiB sequential r$round" put --size 1048576 --count 300
      sync
      run $name "$port" --concurrency 8 --label "$name PUT 16 MiB 8 concurrent r$round" put --size 16777216 --count 48
    done
  done
  exit 0
fi
if [ "$mode" = small ]; then
  for round in $(seq 1 "${ROUNDS:-3}"); do
    for name in base head; do
      port=$([ $name = base ] && echo 17801 || echo 17802)
      sync
      run $name "$port" --concurrency 16 --label "$name PUT 4 KiB 16 concurrent r$round" put --size 4096 --count 20000
    done
  done
  exit 0
fi
seed() { SPILLWAY_TOKEN=$(cat "$work/$1/token") $load --target spillway --url "http://127.0.0.1:$2" seed "${@:3}"; }
la=$(seed base 17801 --size 1300000 --lines); lb=$(seed head 17802 --size 1300000 --lines)
if [ "$mode" = get ]; then
  for round in $(seq 1 "${ROUNDS:-3}"); do
    run base 17801 --label "base full GET 50 MB r$round" get --name "$la" --count 20
    run head 17802 --label "head full GET 50 MB r$round" get --name "$lb" --count 20
  done
  exit 0
fi
ma=$(seed base 17801 --size 1000000 --lines); mb=$(seed head 17802 --size 1000000 --lines)
for round in $(seq 1 "${ROUNDS:-3}"); do
  run base 17801 --concurrency 16 --label "base capped 100 KB read r$round" range --name "$la" --size 50000000 --secs 10
  run head 17802 --concurrency 16 --label "head capped 100 KB read r$round" range --name "$lb" --size 50000000 --secs 10
done
for name in base head; do
  port=$([ $name = base ] && echo 17801 || echo 17802); lines=$([ $name = base ] && echo "$ma" || echo "$mb")
  run $name "$port" --label "$name line page at line 1" line --name "$lines" --line 1 --count 2000
  run $name "$port" --label "$name line page at line 999000" line --name "$lines" --line 999000 --count 2000
done
