#!/usr/bin/env bash
# `spillway exec` of 1 GiB of output against `cat` writing the same stream to a file: wall
# time (best of 3) and peak RSS. Also a 1 GiB run spilling to the store (loopback).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/common.sh
. bench/common.sh
cargo build --release -q -p spillway-client -p spillway-server
work=${BENCH_DIR:-/tmp/spillway-bench-exec}
rm -rf "$work" && mkdir -p "$work"
size=${SIZE:-1073741824}
c=$(best_of_3 sh -c "head -c $size /dev/zero | cat > $work/cat.out")
s=$(best_of_3 target/release/spillway exec --local "$work/out" -- head -c "$size" /dev/zero)
echo "cat > file:            ${c% *} s, peak RSS ${c#* } KiB"
echo "spillway exec --local: ${s% *} s, peak RSS ${s#* } KiB"
awk -v a="${c% *}" -v b="${s% *}" 'BEGIN{printf "throughput ratio (spillway / cat): %.2fx\n", a/b}'
SPILLWAY_DATA_DIR="$work/spw" SPILLWAY_LISTEN=127.0.0.1:17747 RUST_LOG=warn target/release/spillway-server &
spw=$!
trap 'kill $spw 2>/dev/null; wait 2>/dev/null' EXIT
for _ in $(seq 100); do [ -f "$work/spw/token" ] && curl -s -o /dev/null http://127.0.0.1:17747/healthz && break; sleep 0.1; done
r=$( { SPILLWAY_URL=http://127.0.0.1:17747 SPILLWAY_TOKEN=$(cat "$work/spw/token") /usr/bin/time -f '%e %M' \
  target/release/spillway exec -- head -c "$size" /dev/zero > "$work/remote.json"; } 2>&1 | tail -n 1)
echo "spillway exec (store): ${r% *} s, peak RSS ${r#* } KiB, saved: $(python3 -c "import json;print(json.load(open('$work/remote.json'))['stdout']['saved'])")"

# The same 1 GiB through MCP: the official Python SDK calls `run` on `spillway mcp`, spilling
# to a local directory like the --local line above (the venv is scripts/check-clients').
venv=target/clients-venv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" && "$venv/bin/pip" install -q --disable-pip-version-check mcp==2.3.0 schemathesis==4.32.5
fi
rm -rf "$work/mcp-out" && mkdir -p "$work/mcp-out"
m=$(cd "$work/mcp-out" && "$OLDPWD/$venv/bin/python" "$OLDPWD/bench/mcp_run.py" "$OLDPWD/target/release/spillway" "$work/mcp.time" "head -c $size /dev/zero")
t=$(cat "$work/mcp.time" | tail -n 1)
echo "spillway mcp run (local): ${m% *} s for the call, peak RSS of spillway mcp ${t#* } KiB, saved: ${m#* }"
