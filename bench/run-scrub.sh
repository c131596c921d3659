#!/usr/bin/env bash
# The scrub's rate beside b3sum over the same files (api.md v1.3, Integrity): a store of
# SIZE_MB (default 1024) of text outputs, 4 MiB each, on local disk; `spillway-server scrub`
# of it raw, then compacted, against `b3sum` of its raw blob files, each twice (warm: what is
# measured is the checking, not the disk). Prints one line per run and the ratios.
#   bench/run-scrub.sh        (needs b3sum: apt-get install b3sum)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh
command -v b3sum >/dev/null || { echo "b3sum is missing: apt-get install b3sum" >&2; exit 2; }
bench_setup scrub
size_mb=${SIZE_MB:-1024}
bin=${SPILLWAY_SERVER_BIN:-target/release/spillway-server}
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
SPILLWAY_COMPACT_AFTER=100000000 SPILLWAY_SCRUB_INTERVAL=0 start_spillway "$work/data" "$port"
python3 - "$port" "$size_mb" <<'PY'
import sys, urllib.request, os
port, size_mb = int(sys.argv[1]), int(sys.argv[2])
tok = os.environ["SPILLWAY_TOKEN"]
for i in range(size_mb // 4):
    lines = [f"2026-12-07T18:{j % 60:02d}:00Z output {i} line {j} status=ok value={j * 7919 % 100003}\n" for j in range(60_000)]
    body = "".join(lines).encode()[: 4 << 20]
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/blobs?ttl=86400", data=body, method="POST",
                                 headers={"Authorization": f"Bearer {tok}"})
    urllib.request.urlopen(req).read()
PY
kill "$spw"; wait "$spw" 2>/dev/null || true
spw= started=()  # stopped: nothing left for cleanup to stop
files=$(find "$work/data/blobs/blobs" -type f | wc -l)
run() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null; t1=$(date +%s.%N); echo "$t1 - $t0" | bc; }
scrub() { SPILLWAY_DATA_DIR="$work/data" RUST_LOG=warn "$bin" scrub; }
b3() { find "$work/data/blobs/blobs" -type f -print0 | xargs -0 b3sum --num-threads 1; }
b3all() { find "$work/data/blobs/blobs" -type f -print0 | xargs -0 b3sum; }
echo "store: $files raw blobs, $size_mb MiB"
for round in 1 2; do
  s=$(run scrub); b=$(run b3); ba=$(run b3all)
  echo "round $round raw: scrub ${s}s  b3sum(1 thread) ${b}s  b3sum(all cores) ${ba}s" \
       "-> scrub $(echo "$size_mb / $s" | bc) MiB/s, b3sum $(echo "$size_mb / $b" | bc) / $(echo "$size_mb / $ba" | bc) MiB/s," \
       "scrub/b3sum(1 thread) time $(echo "scale=2; $s / $b" | bc)"
done
SPILLWAY_DATA_DIR="$work/data" RUST_LOG=warn "$bin" compact >/dev/null
for round in 1 2; do
  s=$(run scrub)
  echo "round $round compacted: scrub ${s}s -> $(echo "$size_mb / $s" | bc) MiB/s of outputs" \
       "($(du -sm "$work/data/blobs/packs" | cut -f1) MiB of packs), scrub/b3sum(1 thread, raw) time $(echo "scale=2; $s / $b" | bc)"
done
SPILLWAY_DATA_DIR="$work/data" RUST_LOG=warn "$bin" scrub | tail -1
