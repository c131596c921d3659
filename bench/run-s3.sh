#!/usr/bin/env bash
# Spillway on PostgreSQL + S3 beside the same operations sent straight to that S3 server
# (the suite's s3s-fs server, standalone): what verification and metadata cost on top of S3.
# Usage: bench/run-s3.sh [quick]
set -euo pipefail
cd "$(dirname "$0")/.."
quick=${1:-}
# shellcheck source=bench/common.sh
. bench/common.sh
cargo build --release -q -p spillway-server -p spillway-bench
work=${BENCH_DIR:-/tmp/spillway-bench-s3}
rm -rf "$work" && mkdir -p "$work"
start_s3_store "$work/s3" 19000
start_spillway "$work/spw" 17746
load=target/release/spillway-load
S="$load --target spillway --url http://127.0.0.1:17746"
D="$load --target s3 --url bench"
out="$work/results.jsonl"
: > "$out"
n16=16; n1=200; secs=10
[ "$quick" = quick ] && { n16=4; n1=40; secs=3; }
# PUT names the digest (as the SDK does): written straight to the content key as a multipart
# upload. POST does not: staged under tmp/, then copied server-side once the digest is known.
$S --label "spillway PUT 16 MiB sequential" put --announce --size 16777216 --count $n16 | tee -a "$out"
$D --label "s3 PUT 16 MiB sequential" put --size 16777216 --count $n16 | tee -a "$out"
$S --label "spillway POST 16 MiB sequential" put --size 16777216 --count $n16 | tee -a "$out"
$D --label "s3 POST 16 MiB sequential" put --size 16777216 --count $n16 | tee -a "$out"
$S --concurrency 8 --label "spillway PUT 1 MiB 8 concurrent" put --announce --size 1048576 --count $n1 | tee -a "$out"
$D --concurrency 8 --label "s3 PUT 1 MiB 8 concurrent" put --size 1048576 --count $n1 | tee -a "$out"
$S --concurrency 8 --label "spillway POST 1 MiB 8 concurrent" put --size 1048576 --count $n1 | tee -a "$out"
$D --concurrency 8 --label "s3 POST 1 MiB 8 concurrent" put --size 1048576 --count $n1 | tee -a "$out"
sd=$($S seed --size 1300000 --lines); dd=$($D seed --size 1300000 --lines)
$S --concurrency 16 --label "spillway capped 100 KB read, 16 connections" range --name "$sd" --size 50000000 --secs $secs | tee -a "$out"
$D --concurrency 16 --label "s3 100 KB ranged GET, 16 connections" range --name "$dd" --size 50000000 --secs $secs | tee -a "$out"
sed -i 's/"label":"s3 /"label":"nginx /; s/100 KB ranged GET/capped 100 KB read/' "$out"
echo "(the column headed nginx below is S3 direct)"
python3 bench/table.py "$out"
