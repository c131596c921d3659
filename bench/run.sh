#!/usr/bin/env bash
# Side-by-side benchmarks on loopback: spillway-server (embedded default: SQLite + local disk,
# every upload hashed, verified and fsynced) against nginx serving files with WebDAV PUT.
# Prints one JSON line per run and, at the end, a markdown table of ratios.
# Usage: bench/run.sh [quick|put]    (needs nginx: apt-get install nginx; `put`: the PUT rows only)
#        SPILLWAY_SERVER_BIN=path bench/run.sh   runs another build of the server (before/after)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nginx > /dev/null || { echo "bench/run.sh compares against nginx: install it first (Debian: apt-get install nginx-light)" >&2; exit 1; }
quick=${1:-}
cargo build --release -q -p spillway-server -p spillway-bench
work=${BENCH_DIR:-/tmp/spillway-bench}
rm -rf "$work" && mkdir -p "$work/nginx/root/dav" "$work/nginx/tmp" "$work/disk"
load=target/release/spillway-load

# shellcheck source=bench/common.sh
. bench/common.sh
nginx_conf "$work/nginx" 18080 "location /dav/ { dav_methods PUT; create_full_put_path on; }"
nginx -c "$work/nginx/nginx.conf" &
ngx=$!
SPILLWAY_DATA_DIR="$work/spw" SPILLWAY_LISTEN=127.0.0.1:17745 RUST_LOG=warn "${SPILLWAY_SERVER_BIN:-target/release/spillway-server}" &
spw=$!
trap 'kill $ngx $spw 2>/dev/null; wait 2>/dev/null' EXIT
for _ in $(seq 100); do
  if [ -f "$work/spw/token" ] && curl -s -o /dev/null http://127.0.0.1:17745/healthz && curl -s -o /dev/null http://127.0.0.1:18080/; then break; fi
  sleep 0.1
done
export SPILLWAY_TOKEN=$(cat "$work/spw/token")
S="$load --target spillway --url http://127.0.0.1:17745"
N="$load --target nginx --url http://127.0.0.1:18080/dav"
D="$load --target disk --url $work/disk" # the disk's durable speed: write + fsync per file, as dd conv=fsync
out="$work/results.jsonl"
: > "$out"
pair() { # label, concurrency, op args...
  local label=$1 c=$2; shift 2
  sync # each run starts with no dirty pages left by the one before
  $S --concurrency "$c" --label "spillway $label" "$@" | tee -a "$out"
  sync
  $N --concurrency "$c" --label "nginx $label" "$@" | tee -a "$out"
  if [ "$1" = put ] && [ "$3" -ge 1048576 ]; then # large PUTs: also the disk's own durable pace
    sync
    $D --concurrency "$c" --label "disk $label" "$@" | tee -a "$out"
    rm -f "$work"/disk/*
  fi
}
n1=200; n16=24; n4=5000; secs=10; gets=20
[ "$quick" = quick ] && { n1=40; n16=8; n4=1000; secs=3; gets=5; }
pair "PUT 1 MiB sequential" 1 put --size 1048576 --count $n1
pair "PUT 1 MiB 8 concurrent" 8 put --size 1048576 --count $((n1 * 2))
pair "PUT 16 MiB sequential" 1 put --size 16777216 --count $n16
pair "PUT 16 MiB 8 concurrent" 8 put --size 16777216 --count $((n16 * 2))
pair "PUT 4 KiB 16 connections" 16 put --size 4096 --count $n4
[ "$quick" = put ] && { python3 bench/table.py "$out"; exit 0; }
# A 50 MiB log (text, 1.3M lines), the kind of blob the read API pages through.
sd=$($S seed --size 1300000 --lines); sn=$($N seed --size 1300000 --lines)
$S --concurrency 16 --label "spillway capped 100 KB read, 16 connections" range --name "$sd" --size 50000000 --secs $secs | tee -a "$out"
$N --concurrency 16 --label "nginx 100 KB Range GET, 16 connections" range --name "$sn" --size 50000000 --secs $secs | tee -a "$out"
$S --label "spillway full GET 50 MB" get --name "$sd" --count $gets | tee -a "$out"
$N --label "nginx full GET 50 MB" get --name "$sn" --count $gets | tee -a "$out"
lines=$($S seed --size 1000000 --lines)
$S line --name "$lines" --line 500000 --count 300 >/dev/null # warm: the blob's row and file are cached
for r in 1 2 3; do # alternated: a difference of ~10 us is within one run's drift
  $S --label "spillway line page at line 1 r$r" line --name "$lines" --line 1 --count 1000 | tee -a "$out"
  $S --label "spillway line page at line 999000 r$r" line --name "$lines" --line 999000 --count 1000 | tee -a "$out"
done
python3 bench/table.py "$out"
