#!/usr/bin/env bash
# The Python package against the CLI and against plain Python, in one run (release server,
# the wheel scripts/check-python builds, installed in target/python-venv):
#  1. `spillway.exec` of a command printing 1 GiB vs `spillway exec` of it, both spilling to a
#     local directory: wall time and peak RSS (best of 3; the Python figure includes the
#     interpreter's own ~10 MiB);
#  2. `spillway.spill` of a 10 MB string to the store vs what a team would write by hand: a
#     head + tail slice and `requests.post` of the whole to the same store (20 each,
#     interleaved, fresh content every time).
# Usage: bench/run-python.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/common.sh
. bench/common.sh
bench_setup python
cargo build --release -q -p spillway-client
venv=target/python-venv
if ! "$venv/bin/python" -c "import spillway, requests" 2>/dev/null; then
  rm -rf target/wheels "$venv"
  python3 -m pip wheel ./python -w target/wheels --no-deps -q --disable-pip-version-check
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "$(ls target/wheels/spillway_sdk-*.whl)[deepagents,test]" requests
fi
py="$venv/bin/python"
size=${SIZE:-1073741824}
echo "== 1. exec of $size bytes on stdout and a line on stderr"
cmd="head -c $size /dev/zero; echo done >&2"
c=$(best_of_3 target/release/spillway exec --local "$work/out" -- sh -c "$cmd")
p=$(best_of_3 "$py" -c "import spillway, sys; r = spillway.exec(sys.argv[1], target=spillway.LocalDir(sys.argv[2])); assert r['stdout']['saved'] and r['stdout']['total_size'] == $size, r" "$cmd" "$work/out")
echo "{\"measure\": \"exec\", \"bytes\": $size, \"cli_secs\": ${c% *}, \"cli_peak_rss_kib\": ${c#* }, \"python_secs\": ${p% *}, \"python_peak_rss_kib\": ${p#* }}" | tee "$work/results.jsonl"

echo "== 2. spill of a 10 MB string to the store"
start_spillway "$work/data" 17921
SPILLWAY_URL=http://127.0.0.1:17921 "$py" - <<'PY' | tee -a "$work/results.jsonl"
import json, os, statistics, time
import requests, spillway

url, token = os.environ["SPILLWAY_URL"], os.environ["SPILLWAY_TOKEN"]
store = spillway.Store(url, token)
session = requests.Session()
line = "2026-12-02T10:00:00.000Z INFO svc-1 path=/v1/items/12345 status=200 dur_ms=12\n"
base = line * (10_000_000 // len(line))

def by_hand(text):
    # What the receipt shows, cut by hand, and the whole output posted to the store.
    shown = text[:50_000] + text[-50_000:]
    r = session.post(f"{url}/v1/blobs", data=text.encode(), headers={"Authorization": f"Bearer {token}"})
    r.raise_for_status()
    return shown, r.json()["digest"]

def with_spill(text):
    r = spillway.spill(text, target=store)
    assert r["saved"], r.get("save_error")
    return r

times = {"spill": [], "by_hand": []}
for i in range(20):
    for name, f in (("spill", with_spill), ("by_hand", by_hand)):
        text = f"{name} {i} {time.time_ns()}\n" + base
        t0 = time.perf_counter()
        f(text)
        times[name].append(time.perf_counter() - t0)
m = {k: statistics.median(v) * 1000 for k, v in times.items()}
print(json.dumps({"measure": "spill_10mb", "bytes": len(base), "spill_ms_p50": round(m["spill"], 1),
                  "by_hand_ms_p50": round(m["by_hand"], 1), "spill_over_by_hand": round(m["spill"] / m["by_hand"], 2)}))
PY
