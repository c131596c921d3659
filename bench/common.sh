# Sourced by the bench scripts: one release spillway-server on loopback, started and ready.
# bench_setup NAME: builds the release server and load generator, empties the work directory
# ($BENCH_DIR, or /tmp/spillway-bench-NAME) and sets `work` and `load`.
# start_spillway DIR PORT: starts the server (SPILLWAY_SERVER_BIN, or this tree's release build)
# with its data in DIR, waits until it answers and has written its first token, exports
# SPILLWAY_TOKEN and sets spw to its pid; the server is stopped when the script exits.
# start_s3_store DIR PORT [OUT]: the store a server on PostgreSQL + S3 needs (see below).

# What `cleanup` stops and drops when the script exits: the servers started here (and the
# one in `spw`), and the databases made for them.
started=()
databases=()
cleanup() {
  # (Servers a script stopped itself are gone already: kill's complaint is not a failure.)
  kill ${spw:-} "${started[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  for url in "${databases[@]}"; do
    psql "${url%/*}/postgres" -qc "DROP DATABASE IF EXISTS ${url##*/}" >/dev/null 2>&1 || true
  done
}
trap cleanup EXIT

start_spillway() {
  local dir=$1 port=$2
  SPILLWAY_DATA_DIR="$dir" SPILLWAY_LISTEN=127.0.0.1:$port RUST_LOG=warn \
    "${SPILLWAY_SERVER_BIN:-target/release/spillway-server}" &
  spw=$!
  started+=("$spw")
  wait_ready "$dir" "$port"
  SPILLWAY_TOKEN=$(cat "$dir/token")
  export SPILLWAY_TOKEN
}

# start_s3_store DIR PORT [OUT]: a PostgreSQL database of its own (scripts/pg-start) and the
# suite's S3 server on loopback PORT, its files in DIR (bucket `bench`, its stdout to OUT), both
# gone when the script exits; exports what a server needs to use them (SPILLWAY_DATABASE_URL,
# SPILLWAY_BLOB_STORE, the AWS_* settings) and sets s3 to the S3 server's pid.
start_s3_store() {
  local dir=$1 port=$2 admin db="spw_bench_$$_$2"
  admin=$(scripts/pg-start)
  psql "$admin" -qc "CREATE DATABASE $db" >/dev/null
  databases+=("${admin%/*}/$db")
  mkdir -p "$dir/bench"
  export AWS_ENDPOINT=http://127.0.0.1:$port AWS_ACCESS_KEY_ID=spillway-test \
    AWS_SECRET_ACCESS_KEY=spillway-test-secret AWS_REGION=us-east-1 AWS_ALLOW_HTTP=true
  export SPILLWAY_DATABASE_URL="${admin%/*}/$db" SPILLWAY_BLOB_STORE=s3://bench/spill
  target/release/spillway-s3-server "127.0.0.1:$port" "$dir" >"${3:-/dev/null}" 2>/dev/null &
  s3=$!
  started+=("$s3")
}

# wait_ready DIR PORT: returns once the server with its data in DIR answers on PORT and has
# written its first token (or after 10 s).
wait_ready() {
  for _ in $(seq 100); do
    [ -f "$1/token" ] && curl -s -o /dev/null "http://127.0.0.1:$2/healthz" && return
    sleep 0.1
  done
}

# cpu_ticks PID...: the user + system CPU time of the processes, together, in clock ticks.
cpu_ticks() {
  local p
  for p; do cat "/proc/$p/stat"; done | awk '{s += $14 + $15} END {print s}'
}

# with_cpu PID COMMAND...: runs a load-generator COMMAND and prints its JSON line with the CPU
# time process PID spent meanwhile, per request (`server_cpu_us_per_req`).
with_cpu() {
  local pid=$1 before line
  shift
  before=$(cpu_ticks "$pid")
  line=$("$@")
  python3 -c "import json,sys; r=json.loads(sys.argv[1]); r['server_cpu_us_per_req']=round(int(sys.argv[2])*1e6/int(sys.argv[3])/r['requests'],1); print(json.dumps(r))" \
    "$line" "$(( $(cpu_ticks "$pid") - before ))" "$(getconf CLK_TCK)"
}

bench_setup() {
  cargo build --release -q -p spillway-server -p spillway-bench
  work=${BENCH_DIR:-/tmp/spillway-bench-$1}
  rm -rf "$work" && mkdir -p "$work"
  load=target/release/spillway-load
}

# best_of_3 COMMAND...: runs COMMAND three times, each with an empty "$work/out" (and no
# "$work/cat.out"), its output discarded; prints "seconds maxrss_kib" of the fastest run.
best_of_3() {
  local b="" r
  for _ in 1 2 3; do
    rm -rf "$work/out" "$work/cat.out" && mkdir -p "$work/out"
    r=$( { /usr/bin/time -f '%e %M' "$@" >/dev/null; } 2>&1 | tail -n 1)
    if [ -z "$b" ] || awk -v a="${r% *}" -v c="${b% *}" 'BEGIN{exit !(a<c)}'; then b=$r; fi
  done
  echo "$b"
}

# nginx_conf DIR PORT [LOCATIONS]: writes DIR/nginx.conf, nginx as the comparisons run it (2
# workers in the foreground, no access log, sendfile, any body size) serving DIR/root on
# 127.0.0.1:PORT, with LOCATIONS (nginx directives) inside its server block.
nginx_conf() {
  local dir=$1 port=$2 locations=${3:-}
  mkdir -p "$dir/root" "$dir/tmp"
  cat > "$dir/nginx.conf" <<CONF
user root;
worker_processes 2;
daemon off;
pid $dir/nginx.pid;
error_log $dir/error.log;
events { worker_connections 1024; }
http {
  access_log off;
  sendfile on;
  tcp_nopush off;
  tcp_nodelay on;
  client_body_temp_path $dir/tmp;
  client_max_body_size 0;
  keepalive_requests 100000;
  server {
    listen 127.0.0.1:$port;
    root $dir/root;
    $locations
  }
}
CONF
}
