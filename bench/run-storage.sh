#!/usr/bin/env bash
# Storage v2, with a release server, in one run:
#  1. a corpus of real outputs (bench/make-corpus.sh; CORPUS=DIR to reuse one): what each
#     piece contributes (spillway-corpus), whole-file `zstd -3` of the same files, then the
#     real thing — uploaded, `spillway-server compact`, `spillway-server stats` — and the
#     compaction's time against `zstd -3 -T1` over the same files;
#  2. a 50 MB log (1.3 M lines): capped 100 KB reads at random offsets and line pages at line 1
#     and 999,000, raw then compacted; a full GET of it compacted against `zstd -d` of the
#     same bytes to /dev/null;
#  3. 4 KiB PUTs and capped reads while a compaction runs, slice by slice against the same
#     without it;
#  4. the corpus on PostgreSQL + S3 (scripts/pg-start, spillway-s3-server): the S3 requests
#     a compaction makes, and stored/logical there.
# Usage: bench/run-storage.sh   (ROUNDS=N rounds of 3; PARTS="1 2 3 4" the parts to run)
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

part() { [[ " ${PARTS:-1 2 3 4} " == *" $1 "* ]]; }
if part 1; then
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
else
  export SPILLWAY_COMPACT_AFTER=999999999
  start_spillway "$work/data" 17901
  export SPILLWAY_URL=http://127.0.0.1:17901
fi

big=$($load --target spillway --url $SPILLWAY_URL seed --size 1300000 --lines)
lines=$($load --target spillway --url $SPILLWAY_URL seed --size 1000000 --lines)
if part 2; then
echo "== 2. one 50 MB log, raw then compacted"
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
if [ -n "${spw:-}" ]; then kill "$spw"; wait "$spw" 2>/dev/null || true; fi
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

fi

if part 3; then
echo "== 3. small PUTs and capped reads beside the server's own compaction (its niced heavy pool)"
# Each round: new bytes to compact (the corpus twice with its lines reversed: no chunk in common
# with what is stored), then three slices of load on the same data: one on a server that does
# not compact, one on a server that compacts those bytes meanwhile, one on a server that does
# not compact again. The compacting slice is compared with the mean of the two around it, so
# that the database's growth over the run (every slice adds 4,000 rows) weighs on both sides
# alike. The log tells whether the pass was still going when the compacting slice ended.
slice() { # label
  with_cpu "$spw" $load --target spillway --url $SPILLWAY_URL --concurrency 16 --label "$1 PUT 4 KiB" \
    put --size 4096 --count 4000 | tee -a "$out"
  with_cpu "$spw" $load --target spillway --url $SPILLWAY_URL --concurrency 16 --label "$1 capped 100 KB read" \
    range --name "$big" --size 50000000 --secs 3 | tee -a "$out"
}
quiet() { kill "$spw"; wait "$spw" 2>/dev/null || true; start_spillway "$work/data" 17901; }
compacting() {
  kill "$spw"; wait "$spw" 2>/dev/null || true
  SPILLWAY_COMPACT_AFTER=0 SPILLWAY_COMPACT_INTERVAL=1 RUST_LOG=warn,spillway_server::compaction=info \
    target/release/spillway-server --data-dir "$work/data" --listen 127.0.0.1:17901 >"$work/compacting.log" 2>&1 &
  spw=$!
  wait_ready "$work/data" 17901
}
for round in $(seq 1 "${ROUNDS:-3}"); do
  quiet
  for copy in a b; do
    for f in "$corpus"/*; do { echo "round $round$copy"; tac "$f"; } | target/release/spillway put >/dev/null; done
  done
  slice "before r$round"
  compacting
  slice "compacting r$round"
  running=$(grep -q "compaction pass" "$work/compacting.log" && echo false || echo true)
  say "{\"measure\": \"busy_compaction\", \"round\": $round, \"still_compacting_at_slice_end\": $running}"
  quiet
  slice "after r$round"
  # The rest of the pass, before the next round's bytes.
  compacting
  for _ in $(seq 300); do grep -q "compaction pass" "$work/compacting.log" && break; sleep 0.2; done
done
python3 - "$out" <<'PY'
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
p50 = {r["label"]: r["p50_ms"] for r in rows if "label" in r and "p50_ms" in r}
for what in ("PUT 4 KiB", "capped 100 KB read"):
    for label, v in sorted(p50.items()):
        m = re.match(rf"compacting r(\d+) {re.escape(what)}$", label)
        if m:
            r = m.group(1)
            quiet = (p50[f"before r{r} {what}"] + p50[f"after r{r} {what}"]) / 2
            print(json.dumps({"measure": "beside_compaction", "what": what, "round": int(r),
                              "p50_ms_compacting": v, "p50_ms_quiet_mean": round(quiet, 3),
                              "ratio": round(v / quiet, 3)}))
PY
fi

part 4 || exit 0
echo "== 4. the same corpus on PostgreSQL + S3: requests per GiB stored, and the ratio there"
if [ -n "${spw:-}" ]; then kill "$spw"; wait "$spw" 2>/dev/null || true; fi
start_s3_store "$work/s3" 19001 "$work/s3-counts"
start_spillway "$work/s3-data" 17902
export SPILLWAY_URL=http://127.0.0.1:17902
ls "$corpus"/* | xargs -P 4 -n 1 target/release/spillway put >/dev/null
counts() { kill -USR1 "$s3"; sleep 0.5; tail -1 "$work/s3-counts"; }
before=$(counts)
pass=$(target/release/spillway-server compact --data-dir "$work/s3-data")
after=$(counts)
say "{\"measure\": \"s3_compaction\", \"pass\": $pass, \"requests_before\": $before, \"requests_after\": $after, \"stats\": $(target/release/spillway-server stats --data-dir "$work/s3-data")}"
