#!/usr/bin/env bash
# Search across outputs, with a release server on the embedded default (SQLite + local disk):
#  1. 1,000 outputs of 1 MiB (bench/make-logs.py; 1 GiB in all) uploaded with `spillway put`;
#     time to the last page of `/v1/search` (following next_cursor, 1,000 matches per page)
#     for a rare line (one match: every byte scanned) and a common one (every 1,000th line),
#     against `grep -rn` and `rg -n` over the same files — warm (files and blobs in the page
#     cache), then with the page cache dropped before each; ROUNDS rounds, interleaved;
#  2. the same after `spillway-server compact` (the outputs as chunks);
#  3. p50/p99 of 100 KB capped reads (16 connections, 10 s) and 4 KiB PUTs (16 connections)
#     with no search running, then with 2 searches for the rare line walking all the time;
#  4. (only when asked) on PostgreSQL + S3: S3_OUTPUTS (400) of the outputs, more than the
#     server's 256 MiB block cache holds, so every walk reads them all from S3; the rare line's
#     walk with each of S3_BUILDS ("NAME=BINARY ...", default this build), interleaved, each a
#     server started afresh on the same store.
# Usage: bench/run-search.sh   (ROUNDS=N, default 3; PARTS="1 2 3" the parts to run, 4 too)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/common.sh
. bench/common.sh
bench_setup search
cargo build --release -q -p spillway-client
logs=${LOGS:-/tmp/spillway-search-logs}
[ -d "$logs" ] || python3 bench/make-logs.py "$logs" 1000 1048576
out="$work/results.jsonl"
: > "$out"
say() { echo "$1" | tee -a "$out"; }
rounds=${ROUNDS:-3}
can_drop=0
if sync && echo 3 2>/dev/null > /proc/sys/vm/drop_caches; then can_drop=1; fi
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
# elapsed LABEL COMMAND...: runs COMMAND (its output discarded) and prints its wall seconds.
elapsed() {
  local label=$1 t0
  shift
  t0=$EPOCHREALTIME
  "$@" | cat > /dev/null   # a pipe: GNU grep stops at a file's first match when its output is /dev/null
  say "{\"label\": \"$label\", \"secs\": $(python3 -c "print(round($EPOCHREALTIME - $t0, 3))")}"
}

export SPILLWAY_COMPACT_AFTER=999999999
start_spillway "$work/data" 17911
export SPILLWAY_URL=http://127.0.0.1:17911
ls "$logs"/* | xargs -P 4 -n 1 target/release/spillway put --label bench=search > /dev/null
bytes=$(du -sb "$logs" | cut -f1)
say "{\"measure\": \"corpus\", \"outputs\": $(ls "$logs" | wc -l), \"bytes\": $bytes}"
S="$load --target spillway --url $SPILLWAY_URL"
walk() { $S --label "$1" search --query "pattern=$2" --count 1; }

searches() { # searches STAGE: the rare and the common line, warm and cold, beside grep and rg
  local stage=$1
  for _ in $(seq "$rounds"); do
    for p in OOMKilled retrying; do
      cat "$logs"/* > /dev/null
      walk "$stage spillway search $p warm" "$p" > /dev/null   # warms the server's side
      say "$(walk "$stage spillway search $p warm" "$p")"
      elapsed "$stage grep -rn $p warm" grep -rn "$p" "$logs"
      elapsed "$stage rg -n $p warm" rg -n "$p" "$logs"
      if [ $can_drop = 1 ]; then
        drop; say "$(walk "$stage spillway search $p cold" "$p")"
        drop; elapsed "$stage grep -rn $p cold" grep -rn "$p" "$logs"
        drop; elapsed "$stage rg -n $p cold" rg -n "$p" "$logs"
      fi
    done
  done
}
part() { [[ " ${PARTS:-1 2 3} " == *" $1 "* ]]; }
if part 1; then
  echo "== 1. raw outputs"
  searches raw
fi
if part 2; then
  echo "== 2. compacted"
  target/release/spillway-server compact --data-dir "$work/data" | tee -a "$out"
  searches compacted
fi
if part 4; then
  echo "== 4. on PostgreSQL + S3"
  start_s3_store "$work/s3" 19002
  s3_server() { # s3_server BIN: a server on the S3 store, alone on it
    if [ -n "${spw:-}" ]; then kill "$spw"; wait "$spw" 2>/dev/null || true; fi
    SPILLWAY_SERVER_BIN=$1 start_spillway "$work/s3-data" 17912
  }
  read -r -a builds <<< "${S3_BUILDS:-this-build=${SPILLWAY_SERVER_BIN:-target/release/spillway-server}}"
  s3_server "${builds[0]#*=}"
  # awk, not head: it reads all of ls's output, so that ls does not die of a closed pipe.
  ls "$logs"/* | awk -v n="${S3_OUTPUTS:-400}" 'NR <= n' | SPILLWAY_URL=http://127.0.0.1:17912 xargs -P 4 -n 1 \
    target/release/spillway put --label bench=s3 > /dev/null
  for _ in $(seq "$rounds"); do
    for build in "${builds[@]}"; do
      s3_server "${build#*=}"
      say "$($load --target spillway --url http://127.0.0.1:17912 --label "s3 ${build%%=*}" search \
        --query "pattern=OOMKilled&label.bench=s3" --count 1)"
    done
  done
fi
if part 3; then

  echo "== 3. capped reads and small PUTs beside 2 searches"
  log=$($S seed --size 1300000 --lines)
  for r in $(seq "$rounds"); do
    say "$($S --concurrency 16 --label "alone capped read $r" range --name "$log" --size 50000000 --secs 10)"
    say "$($S --concurrency 16 --label "alone 4 KiB PUT $r" put --size 4096 --count 20000)"
    $S --concurrency 2 --label searching search --query pattern=OOMKilled --count 100000 > /dev/null &
    bg=$!
    sleep 1
    say "$($S --concurrency 16 --label "searching capped read $r" range --name "$log" --size 50000000 --secs 10)"
    say "$($S --concurrency 16 --label "searching 4 KiB PUT $r" put --size 4096 --count 20000)"
    kill $bg; wait $bg 2>/dev/null || true
  done
fi
python3 - "$out" "$bytes" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
size = int(sys.argv[2])
by = {}
for r in rows:
    if "label" in r:
        walk = r["label"].split()[1] in ("spillway", "grep", "rg")
        by.setdefault(r["label"], []).append(r["secs"] if walk else r)
if any(k.split()[1:3] == ["spillway", "search"] for k in by):
    print("| stage | pattern | cache | spillway search (s) | grep -rn (s) | rg -n (s) | search MB/s | grep MB/s | search / grep throughput |")
    print("|---|---|---|---|---|---|---|---|---|")
for stage in ("raw", "compacted"):
    for p in ("OOMKilled", "retrying"):
        for cache in ("warm", "cold"):
            s = by.get(f"{stage} spillway search {p} {cache}")
            if not s:
                continue
            g, rg = by[f"{stage} grep -rn {p} {cache}"], by[f"{stage} rg -n {p} {cache}"]
            m = lambda v: statistics.median(v)
            print(f"| {stage} | {p} | {cache} | {' / '.join(f'{x:.2f}' for x in s)} | {' / '.join(f'{x:.2f}' for x in g)} | "
                  f"{' / '.join(f'{x:.2f}' for x in rg)} | {size / m(s) / 1e6:.0f} | {size / m(g) / 1e6:.0f} | {m(g) / m(s):.2f}x |")
s3 = [k for k in by if k.startswith("s3 ")]
if s3:
    print()
    print("| on PostgreSQL + S3 | rare line, time to the last page (s) | median |")
    print("|---|---|---|")
    for k in s3:
        secs = [r["secs"] for r in by[k]]
        print(f"| {k[3:]} | {' / '.join(f'{x:.2f}' for x in secs)} | {statistics.median(secs):.2f} |")
if any(k.startswith("alone ") for k in by):
    print()
    print("| workload | alone p50 / p99 (ms) | beside 2 searches p50 / p99 (ms) | p99 ratio |")
    print("|---|---|---|---|")
for w in ("capped read", "4 KiB PUT"):
    rs = sorted(k for k in by if k.startswith(f"alone {w} "))
    for k in rs:
        a, b = by[k][0], by[k.replace("alone", "searching")][0]
        print(f"| {w} {k.rsplit(' ', 1)[1]} | {a['p50_ms']} / {a['p99_ms']} | {b['p50_ms']} / {b['p99_ms']} | {b['p99_ms'] / a['p99_ms']:.2f}x |")
PY
