#!/usr/bin/env bash
# Does a retention pass stall uploads? A store of SMALL small blobs (default 200,000 4 KiB
# uploads, each referenced for the default TTL), then ROUNDS runs (default 6) of 20,000 4 KiB PUTs
# on 16 connections: first with retention every hour (no pass in the window), then the same data
# directory under a server that runs a pass every 2 s. p50 / p99 / max of each run; a pass that
# holds the database writer shows in the max and the p99. Release server on the embedded default
# (SPILLWAY_SERVER_BIN another build).
# Usage: bench/run-retention-stall.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/common.sh
. bench/common.sh
bench_setup retention-stall
rounds=${ROUNDS:-6}
S="$load --target spillway --url http://127.0.0.1:17922"
export SPILLWAY_RETENTION_INTERVAL=3600
start_spillway "$work/data" 17922
$S --concurrency 16 --label seed put --size 4096 --count "${SMALL:-200000}" > /dev/null
for r in $(seq "$rounds"); do $S --concurrency 16 --label "hourly $r" put --size 4096 --count 20000; done
kill "$spw"; wait "$spw" 2>/dev/null || true
export SPILLWAY_RETENTION_INTERVAL=2
start_spillway "$work/data" 17922
for r in $(seq "$rounds"); do $S --concurrency 16 --label "every 2 s $r" put --size 4096 --count 20000; done
