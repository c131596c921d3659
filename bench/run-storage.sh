#!/usr/bin/env bash
# Storage v2, with a release server, in one run:
#  1. a corpus of real outputs (bench/make-corpus.sh; CORPUS=DIR to reuse one): what each
#     piece contributes (spillway-corpus), whole-file `zstd -3` of the same files, then the
#     real thing — uploaded, `spillway-server compact`, `spillway-server stats` — and the
#     compaction's time against `zstd -3 -T1` over the same files;
#  2. a 50 MB log (1.3 M lines): capped 100 KB reads at random offsets and line pages at line 1
#     and 999,000, raw then compacted; a full GET of it compacted against `zstd -d` of the
#     same bytes to /dev/null;
#  3. 4 KiB PUTs and capped reads while a compaction of the corpus runs, against the same
#     without it.
# Usage: bench/run-storage.sh   (ROUNDS=N for more rounds of 2 and 3)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/common.sh
. bench/common.sh
bench_setup storage
cargo build --release -q -p spillway-client
corpus=${CORPUS:-$work/corpus}
[ -d "$corpus" ] || bench/make-corpus.sh "$corpus" >/dev/null
out="$work/results.jsonl"
: > "$out"
say() { echo "$1" | tee -a "$out"; }
secs() { python3 -c "import time; print(time.time())"; }

echo "== 1. the corpus: $(ls "$corpus" | wc -l) outputs, $(du -sb "$corpus" | cut -f1) bytes"
target/release/spillway-corpus "$corpus" | tee -a "$out"
zstd_bytes=0
for f in "$corpus"/*; do zstd_bytes=$((zstd_bytes + $(zstd -3 -T1 -q -c "$f" | wc -c))); done
say "{\"measure\": \"whole_file_zstd_3\", \"stored_bytes\": $zstd_bytes, \"logical_bytes\": $(du -sb "$corpus" | cut -f1)}"

# The server compacts only when asked: `spillway-server compact` is timed.
export SPILLWAY_COMPACT_AFTER=999999999
start_spillway "$work/data" 17901
export SPILLWAY_URL=http://127.0.0.1:17901
ls "$corpus"/* | xargs -P 4 -n 1 target/release/spillway put --label corpus=1 >/dev/null
say "{\"measure\": \"raw_stats\", \"stats\": $(target/release/spillway-server stats --data-dir "$work/data")}"
t0=$(secs)
for f in "$corpus"/*; do zstd -3 -T1 -q -c "$f" > /dev/null; done
t1=$(secs)
pass=$(target/release/spillway-server compact --data-dir "$work/data")
t2=$(secs)
say "{\"measure\": \"compaction\", \"pass\": $pass, \"compact_s\": $(python3 -c "print(round($t2-$t1,2))"), \"zstd_3_T1_s\": $(python3 -c "print(round($t1-$t0,2))")}"
say "{\"measure\": \"compacted_stats\", \"stats\": $(target/release/spillway-server stats --data-dir "$work/data")}"

echo "== 2. one 50 MB log, raw then compacted"
big=$($load --target spillway --url $SPILLWAY_URL seed --size 1300000 --lines)
lines=$($load --target spillway --url $SPILLWAY_URL seed --size 1000000 --lines)
read_round() { # state
  with_cpu "$spw" $load --target spillway --url $SPILLWAY_URL --concurrency 16 --label "$1 capped 100 KB read" \
    range --name "$big" --size 50000000 --secs 10 | tee -a "$out"
  with_cpu "$spw" $load --target spillway --url $SPILLWAY_URL --label "$1 line page at line 1" \
    line --name "$lines" --line 1 --count 2000 | tee -a "$out"
  with_cpu "$spw" $load --target spillway --url $SPILLWAY_URL --label "$1 line page at line 999000" \
    line --name "$lines" --line 999000 --count 2000 | tee -a "$out"
}
read_round raw
target/release/spillway-server compact --data-dir "$work/data" > /dev/null
# A new server: nothing of the raw blobs is cached in it any more.
kill "$spw"; wait "$spw" 2>/dev/null || true
start_spillway "$work/data" 17901
read_round compacted
digest=$(curl -s -H "Authorization: Bearer $SPILLWAY_TOKEN" "$SPILLWAY_URL/v1/refs?limit=1000" \
  | python3 -c "import json,sys; print([r['digest'] for r in json.load(sys.stdin)['refs'] if r['size'] > 40000000][0])")
curl -s -H "Authorization: Bearer $SPILLWAY_TOKEN" "$SPILLWAY_URL/v1/blobs/$digest" -o "$work/big.log"
zstd -3 -q -f "$work/big.log" -o "$work/big.log.zst"
for round in 1 2 3; do
  t0=$(secs); zstd -d -T1 -q -c "$work/big.log.zst" > /dev/null; t1=$(secs)
  curl -s -H "Authorization: Bearer $SPILLWAY_TOKEN" "$SPILLWAY_URL/v1/blobs/$digest" -o /dev/null; t2=$(secs)
  say "{\"measure\": \"full_get_compacted\", \"round\": $round, \"bytes\": $(stat -c %s "$work/big.log"), \"get_s\": $(python3 -c "print(round($t2-$t1,3))"), \"zstd_d_s\": $(python3 -c "print(round($t1-$t0,3))")}"
done

echo "== 3. small PUTs and capped reads beside the server's own compaction (its niced heavy pool)"
busy_round() { # label
  with_cpu "$spw" $load --target spillway --url $SPILLWAY_URL --concurrency 16 --label "$1 PUT 4 KiB" \
    put --size 4096 --count 20000 | tee -a "$out"
  with_cpu "$spw" $load --target spillway --url $SPILLWAY_URL --concurrency 16 --label "$1 capped 100 KB read" \
    range --name "$big" --size 50000000 --secs 8 | tee -a "$out"
}
restart() { kill "$spw"; wait "$spw" 2>/dev/null || true; start_spillway "$work/data" 17901; }
for round in $(seq 1 "${ROUNDS:-2}"); do
  busy_round "quiet r$round"
  # New bytes to compact: the corpus with its lines in reverse order (no chunk in common).
  for f in "$corpus"/*; do { echo "round $round"; tac "$f"; } | target/release/spillway put --label busy=$round >/dev/null; done
  before=$(target/release/spillway-server stats --data-dir "$work/data")
  SPILLWAY_COMPACT_AFTER=0 SPILLWAY_COMPACT_INTERVAL=1 restart
  t0=$(secs)
  busy_round "compacting r$round"
  t1=$(secs)
  say "{\"measure\": \"busy_compaction\", \"round\": $round, \"busy_s\": $(python3 -c "print(round($t1-$t0,1))"), \"before\": $before, \"after\": $(target/release/spillway-server stats --data-dir "$work/data")}"
  SPILLWAY_COMPACT_AFTER=999999999 restart
done
