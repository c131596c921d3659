#!/usr/bin/env bash
# Profiles the capped read: perf record on a release spillway-server while 16 connections read
# 100 KB pages at random offsets of a 50 MB text log (or, with `binary`, 50 MB of random
# bytes: every page lossy); prints the top frames by self time.
# Usage: bench/profile-read.sh [binary]   Needs perf (Debian: linux-perf).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p spillway-server -p spillway-bench
work=/tmp/spillway-prof; rm -rf $work; mkdir -p $work
SPILLWAY_DATA_DIR=$work/d SPILLWAY_LISTEN=127.0.0.1:17811 RUST_LOG=warn target/release/spillway-server > $work/log 2>&1 &
pid=$!
for i in $(seq 100); do [ -f $work/d/token ] && curl -s -o /dev/null http://127.0.0.1:17811/healthz && break; sleep 0.1; done
export SPILLWAY_TOKEN=$(cat $work/d/token)
if [ "${1:-}" = binary ]; then seed="--size 50000000"; else seed="--size 1300000 --lines"; fi
# shellcheck disable=SC2086
name=$(target/release/spillway-load --target spillway --url http://127.0.0.1:17811 seed $seed)
target/release/spillway-load --target spillway --url http://127.0.0.1:17811 --concurrency 16 --label warm range --name "$name" --size 50000000 --secs 3 >/dev/null
perf record -F 999 -g -p $pid -o $work/perf.data -- sleep 8 > /dev/null 2>&1 &
perfpid=$!
target/release/spillway-load --target spillway --url http://127.0.0.1:17811 --concurrency 16 --label prof range --name "$name" --size 50000000 --secs 8
wait $perfpid || true
kill $pid
perf report -i $work/perf.data --no-children --percent-limit 1.5 --stdio -g none 2>/dev/null | grep -v "^#" | grep -v "^$" | head -40
