#!/usr/bin/env bash
# bench/callgrind-chunk-check.sh BIN DATADIR N: a server build under callgrind on a data directory
# (one holding a compacted log, as bench/run-chunk-check.sh leaves them under
# /tmp/spillway-bench-chunk-check/), N capped reads at fixed offsets with the text cache off and a
# 1 MiB chunk cache; prints the total instruction count (run once with N=0 to subtract start-up).
bin=$1 dir=$2 n=$3 port=17977
tok=$(cat $dir/token)
digest=$(sqlite3 $dir/spillway.db "select digest from blobs order by size desc limit 1" 2>/dev/null)
SPILLWAY_DATA_DIR=$dir SPILLWAY_LISTEN=127.0.0.1:$port SPILLWAY_TEXT_CACHE_BYTES=0 SPILLWAY_READ_CACHE_BYTES=1048576 \
  SPILLWAY_SCRUB_INTERVAL=0 SPILLWAY_COMPACT_INTERVAL=100000 SPILLWAY_RETENTION_INTERVAL=100000 RUST_LOG=error \
  valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.out.$$ $bin > /tmp/cg.log.$$ 2>&1 &
pid=$!
for i in $(seq 300); do curl -s -o /dev/null "http://127.0.0.1:$port/healthz" && break; sleep 0.2; done
size=$(curl -sI -H "Authorization: Bearer $tok" "http://127.0.0.1:$port/v1/blobs/blake3:$digest" | awk 'tolower($1)=="content-length:" {print $2+0}')
for i in $(seq $n); do
  off=$(( (i * 7919 * 131071) % (size - 200000) ))
  curl -s -o /dev/null -H "Authorization: Bearer $tok" "http://127.0.0.1:$port/v1/blobs/blake3:$digest/read?offset=$off&limit=100000"
done
kill -INT $pid; wait $pid
grep -h "^summary\|^totals" /tmp/cg.out.$$ | head -1
rm -f /tmp/cg.out.$$
