#!/usr/bin/env bash
# The capped read against its floor: the yardstick's capped read (its 50 MiB printable-text
# object, its bloadgen, 16 connections, 100,000-byte pages at random offsets) sent in turn to
# nginx (Range GETs of the object file, sendfile on), to `spillway-read-floor` (axum, hyper and
# the kernel answering the server's own JSON body type with none of its work, cold and --hot)
# and to the release server on its default flags. Prints reads/s and CPU per read of each, each
# round; ratios within a round are what compare (this machine's speed moves from minute to
# minute).
# Usage: bench/run-read-floor.sh   Env: ROUNDS=3, SECS=6, YARDSTICK=../shared/bench,
# SPILLWAY_SERVER_BIN= another build of the server. Needs nginx.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nginx > /dev/null || { echo "needs nginx (Debian: apt-get install nginx)" >&2; exit 1; }
cargo build --release -q -p spillway-server -p spillway-bench
rounds=${ROUNDS:-3}
secs=${SECS:-6}
# shellcheck source=bench/yardstick.sh
. bench/yardstick.sh
work=/tmp/spillway-read-floor
yardstick_read_setup $work floor-obj
# shellcheck source=bench/common.sh
. bench/common.sh
nginx_conf $work/nginx 18081
cp $work/obj $work/nginx/root/obj
nginx -c $work/nginx/nginx.conf & ngx=$!
target/release/spillway-read-floor --listen 127.0.0.1:17833 --object $work/obj & cold=$!
target/release/spillway-read-floor --listen 127.0.0.1:17834 --object $work/obj --hot & hot=$!
"${SPILLWAY_SERVER_BIN:-target/release/spillway-server}" --listen 127.0.0.1:17835 --data-dir $work/d > $work/log 2>&1 &
ours=$!
started+=("$ngx" "$cold" "$hot" "$ours") # stopped by common.sh's cleanup
wait_ready $work/d 17835
for port in 18081 17833 17834; do
  for _ in $(seq 100); do curl -s -o /dev/null http://127.0.0.1:$port/ && break; sleep 0.1; done
done
printf 'Authorization: Bearer %s\n' "$(cat $work/d/token)" > $work/headers
digest=$(curl -sf -X POST -H @$work/headers --data-binary @$work/obj http://127.0.0.1:17835/v1/blobs |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["digest"])')
# One target: NAME PORT [JSON page URL]; prints its reads/s and the CPU per read of the processes
# in `cpus` (nginx's: its workers'). Fails if any answer was not a 200 or not a JSON page.
run() {
  local name=$1 port=$2 url=${3:-} t0 t1 out
  local how=(--path /obj)
  [ -z "$url" ] || how=(--url "$url" --json-length 1 --expect-status 200 --header-file $work/headers)
  "$bloadgen" range --addr 127.0.0.1:$port "${how[@]}" --size $((50 << 20)) --len 100000 --conns 16 --duration 2 > /dev/null
  t0=$(cpu_ticks "${cpus[@]}")
  out=$("$bloadgen" range --addr 127.0.0.1:$port "${how[@]}" --size $((50 << 20)) --len 100000 --conns 16 --duration "$secs")
  t1=$(cpu_ticks "${cpus[@]}")
  python3 - "$name" "$out" "$((t1 - t0))" "$(getconf CLK_TCK)" <<'PY'
import json, sys
name, d, ticks, hz = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
print(json.dumps({"target": name, "rps": round(d["rps"]), "us_per_read": round(ticks / hz / d["requests"] * 1e6, 1),
                  "p99_ms": d["p99_us"] / 1000}))
if d["err_status"] or d.get("json_bad") or d["err_io"]:
    sys.exit(f"{name}: {d['err_status']} answers not 200, {d.get('json_bad')} not a JSON page, {d['err_io']} I/O errors")
PY
}
for r in $(seq "$rounds"); do
  echo "round $r"
  mapfile -t cpus < <(pgrep -P $ngx)
  run nginx 18081
  cpus=($cold)
  run floor-cold 17833 "/v1/blobs/x/read?offset={offset}&limit=100000"
  cpus=($hot)
  run floor-hot 17834 "/v1/blobs/x/read?offset={offset}&limit=100000"
  cpus=($ours)
  run spillway 17835 "/v1/blobs/$digest/read?offset={offset}&limit=100000"
done
