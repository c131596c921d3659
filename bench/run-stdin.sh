#!/usr/bin/env bash
# A saved output as a command's stdin: `spillway exec --stdin` of a 1 GB output into `wc -l`,
# beside the plain alternatives — `wc -l < file` (the bytes on local disk) and `spillway get |
# wc -l` (download, verified, then piped) — on the embedded store (loopback). Wall time (best of
# 3) and peak RSS of the command line, and the ratios to `wc -l < file`.
# Usage: bench/run-stdin.sh      (SIZE=bytes to choose; default 1,000,000,000)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/common.sh
. bench/common.sh
cargo build --release -q -p spillway-client -p spillway-server
work=${BENCH_DIR:-/tmp/spillway-bench-stdin}
rm -rf "$work" && mkdir -p "$work"
size=${SIZE:-1000000000}
# About 100-byte JSON lines, as a service's request log.
python3 - "$size" "$work/log.jsonl" <<'PY'
import sys
size, path = int(sys.argv[1]), sys.argv[2]
with open(path, "w") as f:
    i, written, block = 0, 0, []
    while written < size:
        line = '{"i":%10d,"status":%d,"path":"/api/v1/items/%8d","pad":"%30s"}\n' % (i, 500 if i % 7 == 0 else 200, i % 1000, "")
        block.append(line)
        written += len(line)
        i += 1
        if len(block) == 100000:
            f.write("".join(block)); block = []
    f.write("".join(block))
PY
start_spillway "$work/spw" 17748
export SPILLWAY_URL=http://127.0.0.1:17748
d=$(target/release/spillway put "$work/log.jsonl" | python3 -c 'import json,sys; print(json.load(sys.stdin)["digest"])')
plain=$(best_of_3 sh -c "wc -l < $work/log.jsonl")
get=$(best_of_3 sh -c "target/release/spillway get $d | wc -l")
stdin=$(best_of_3 target/release/spillway exec --stdin "$d" -- wc -l)
lines=$(target/release/spillway exec --stdin "$d" -- wc -l | python3 -c 'import json,sys; print(json.load(sys.stdin)["stdout"]["result"].strip())')
echo "size $(stat -c %s "$work/log.jsonl") bytes, $lines lines (exec --stdin's count)"
echo "wc -l < file:                 ${plain% *} s, peak RSS ${plain#* } KiB"
echo "spillway get | wc -l:         ${get% *} s, peak RSS ${get#* } KiB"
echo "spillway exec --stdin, wc -l: ${stdin% *} s, peak RSS ${stdin#* } KiB"
awk -v p="${plain% *}" -v g="${get% *}" -v s="${stdin% *}" \
  'BEGIN{printf "time ratio to wc -l < file: get | wc -l %.2fx, exec --stdin %.2fx (exec --stdin / get | wc -l: %.2fx)\n", g/p, s/p, s/g}'
