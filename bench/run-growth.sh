#!/usr/bin/env bash
# Does a request or a pass cost what it does, or what the store holds? One store grown to each
# of SIZES live outputs (default "10000 100000 1000000"; 1 KiB each, default TTL, 16
# connections), on BACKENDS (default "sqlite pg-s3": the embedded default, then PostgreSQL + the
# suite's S3 server), and at each size, one JSON line of:
#   retention_pass_s     one pass with nothing due inside the server (its gauge
#                        spillway_retention_pass_seconds, passes every 2 s, uploads stopped)
#   retention_nothing_s  a `spillway-server retention` run with nothing due (best of 3, the
#                        whole process: start, pass, exit)
#   retention_1pct_s     the same with 1 % of SIZE outputs expired (uploaded with ttl=1, no
#                        grace: their references go and their rows and bytes are deleted)
#   put_*                4 KiB uploads (20,000 on 16 connections): alone, then beside a server
#                        running a retention pass every 2 s
#   read_p99_ms          capped 100,000-byte reads of a 10 MiB output, 5 s
#   search_first_s       the first answer of a search for a pattern found nowhere
#   refs_first_s         the first page of `GET /v1/refs`
#   stats_s              `spillway-server stats` (best of 3)
#   restart_s            from a restart to `/healthz` answering
#   rss_kib, db_bytes    the server's resident memory; the database's size on disk
# Usage: bench/run-growth.sh        (SIZES=… BACKENDS=… to choose)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/common.sh
. bench/common.sh
bench_setup growth
cargo build --release -q -p spillway-bench --bin spillway-s3-server
bin=${SPILLWAY_SERVER_BIN:-target/release/spillway-server}
port=17931
export SPILLWAY_METRICS_LISTEN=127.0.0.1:17933
url=http://127.0.0.1:$port
S="$load --target spillway --url $url --concurrency 16"

# best3 COMMAND…: the fastest of three runs' wall seconds, output discarded.
best3() {
  python3 -c 'import subprocess, sys, time
best = None
for _ in range(3):
    t = time.perf_counter()
    subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    t = time.perf_counter() - t
    best = t if best is None else min(best, t)
print(round(best, 4))' "$@"
}

# serve INTERVAL: (re)starts the server on the store with a retention pass every INTERVAL s.
serve() {
  [ -n "${spw:-}" ] && { kill "$spw" 2>/dev/null || true; wait "$spw" 2>/dev/null || true; }
  SPILLWAY_RETENTION_INTERVAL=$1 start_spillway "$work/$backend" "$port"
}

curl_s() { curl -s -o /dev/null -w '%{time_total}' -H "Authorization: Bearer $SPILLWAY_TOKEN" "$url$1"; }
field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }

for backend in ${BACKENDS:-sqlite pg-s3}; do
  unset SPILLWAY_DATABASE_URL SPILLWAY_BLOB_STORE
  export SPILLWAY_DATA_DIR=$work/$backend
  mkdir -p "$SPILLWAY_DATA_DIR"
  if [ "$backend" = pg-s3 ]; then start_s3_store "$work/s3" 17932; fi
  serve 3600
  big=$($S seed --size $((10 << 20)))
  grown=0
  for size in ${SIZES:-10000 100000 1000000}; do
    $S --label seed put --size 1024 --count $((size - grown)) >/dev/null
    grown=$size
    nothing=$(best3 "$bin" retention)
    $S --label due put --size 1024 --count $((size / 100)) --ttl 1 >/dev/null
    sleep 2
    due=$(SPILLWAY_RETENTION_GRACE=0 python3 -c 'import subprocess, sys, time
t = time.perf_counter()
subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=True)
print(round(time.perf_counter() - t, 4))' "$bin" retention)
    alone=$($S --label alone put --size 4096 --count 20000)
    read=$($S --label read range --name "$big" --size $((10 << 20)) --secs 5)
    search=$(curl_s "/v1/search?pattern=found-nowhere-$RANDOM")
    refs=$(curl_s "/v1/refs?limit=100")
    stats=$(best3 "$bin" stats)
    rss=$(awk '/VmRSS/ {print $2}' "/proc/$spw/status")
    if [ "$backend" = pg-s3 ]; then
      db=$(psql "$SPILLWAY_DATABASE_URL" -tAc "SELECT pg_database_size(current_database())")
    else
      db=$(du -cb "$SPILLWAY_DATA_DIR"/spillway.db* | tail -n 1 | cut -f1)
    fi
    serve 2
    beside=$($S --label beside put --size 4096 --count 20000)
    sleep 4.5  # two passes with nothing to do since the last
    pass=$(curl -s "http://$SPILLWAY_METRICS_LISTEN/metrics" | awk '$1 == "spillway_retention_pass_seconds" {print $2}')
    kill "$spw"; wait "$spw" 2>/dev/null || true
    t0=$(date +%s%N)
    SPILLWAY_LISTEN=127.0.0.1:$port RUST_LOG=warn SPILLWAY_RETENTION_INTERVAL=3600 "$bin" &
    spw=$!
    started+=("$spw")
    until curl -s -o /dev/null "$url/healthz"; do sleep 0.005; done
    restart=$(( ($(date +%s%N) - t0) / 1000000 ))
    python3 - "$backend" "$size" "$nothing" "$due" "$alone" "$beside" "$read" "$search" "$refs" "$stats" "$restart" "$rss" "$db" "$pass" <<'PY'
import json, sys
b, size, nothing, due, alone, beside, read, search, refs, stats, restart, rss, db, pass_s = sys.argv[1:]
alone, beside, read = json.loads(alone), json.loads(beside), json.loads(read)
print(json.dumps({
    "backend": b, "outputs": int(size),
    "retention_pass_s": round(float(pass_s), 4),
    "retention_nothing_s": float(nothing), "retention_1pct_s": float(due),
    "put_p50_ms": alone["p50_ms"], "put_p99_ms": alone["p99_ms"], "put_max_ms": alone["max_ms"],
    "put_beside_p99_ms": beside["p99_ms"], "put_beside_max_ms": beside["max_ms"],
    "put_per_s": alone["req_per_s"], "put_beside_per_s": beside["req_per_s"],
    "read_p99_ms": read["p99_ms"], "search_first_s": float(search), "refs_first_s": float(refs),
    "stats_s": float(stats), "restart_s": int(restart) / 1000, "rss_kib": int(rss), "db_bytes": int(db),
}))
PY
  done
  kill "$spw" 2>/dev/null || true
  wait "$spw" 2>/dev/null || true
  spw=
done
