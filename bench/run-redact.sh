#!/usr/bin/env bash
# Redaction, with a release server on the embedded default, in one run:
#  1. capped 100 KB reads at random offsets with `redact=true` against the same without, with
#     the server's CPU per request: a 50 MiB log with no secret, and one with a secret every
#     100 lines (ROUNDS rounds, interleaved, 4 connections, 10 s each);
#  2. `spillway exec` of 1 GiB of log lines (to a local directory) with redaction on (the
#     default) and off (`--no-redact`): best of 3;
#  3. false alarms: the built-in detector (spillway-redact-scan) over outputs with no secret —
#     the storage corpus (bench/make-corpus.sh: build and test logs, `dpkg -l`, `git log
#     --stat`, JSON logs), the search benchmark's service logs, and JSON logs full of UUIDs,
#     `blake3:`/`sha256:` digests, git SHAs, base64 payloads, paths and timestamps: marks per MiB.
# Usage: bench/run-redact.sh   (ROUNDS=N, default 3; CORPUS=DIR a corpus made already;
#        PARTS="1 2 3" the parts to run)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/common.sh
. bench/common.sh
bench_setup redact
cargo build --release -q -p spillway-client
out="$work/results.jsonl"
: > "$out"
say() { echo "$1" | tee -a "$out"; }
rounds=${ROUNDS:-3}
part() { [[ " ${PARTS:-1 2 3} " == *" $1 "* ]]; }

python3 - "$work" <<'PY'
import base64, hashlib, json, os, random, sys, uuid
work = sys.argv[1]
rng = random.Random(7)
secrets = [  # fake values in the providers' formats (store-api/src/redact/samples.rs has more)
    "export AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE",
    "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "GITHUB_TOKEN=ghs_16C7e42F292c6912E7710c838347Ae178B4a",
    "curl -H 'Authorization: Bearer abcdef0123456789abcdef0123456789' https://api.example.com",
    "DATABASE_URL=postgres://app:s3cr3t-pass@db.internal:5432/app",
    "OPENAI_API_KEY=sk-proj-4fJ8kL2mN9pQ1rS5tU7vW3xY6zA0bC",
]
def log(path, every):
    with open(path, "w") as f:
        k, size = 0, 0
        while size < 50 << 20:
            k += 1
            if every and k % every == 0:
                line = f"2026-12-02T10:00:00.000Z DEBUG env {secrets[k // every % len(secrets)]}\n"
            else:
                line = (f"2026-12-02T10:{k // 60000 % 60:02}:{k // 1000 % 60:02}.{k % 1000:03}Z INFO svc-{k % 17} "
                        f"req={rng.getrandbits(64):016x} path=/v1/items/{rng.randrange(100000)} status=200 dur_ms={rng.randrange(900)}\n")
            f.write(line)
            size += len(line)
log(f"{work}/plain.log", 0)
log(f"{work}/secrets.log", 100)
with open(f"{work}/ids.jsonl", "w") as f:
    for i in range(60000):
        body = rng.randbytes(48)
        f.write(json.dumps({
            "ts": f"2026-12-02T10:{i // 60 % 60:02}:{i % 60:02}.{i % 1000:03}Z", "level": "info",
            "request_id": str(uuid.UUID(int=rng.getrandbits(128))), "trace": rng.getrandbits(128).to_bytes(16, "big").hex(),
            "blob": "blake3:" + hashlib.blake2b(body, digest_size=32).hexdigest(), "sha256": "sha256:" + hashlib.sha256(body).hexdigest(),
            "commit": hashlib.sha1(body).hexdigest(), "payload": base64.b64encode(body).decode(),
            "path": f"/var/lib/kubelet/pods/{uuid.UUID(int=rng.getrandbits(128))}/volumes/kubernetes.io~secret/default-token",
            "image": f"registry.example.com/app@sha256:{hashlib.sha256(body[::-1]).hexdigest()}",
        }) + "\n")
PY

start_spillway "$work/data" 17931
export SPILLWAY_URL=http://127.0.0.1:17931
S="$load --target spillway --url $SPILLWAY_URL --concurrency 4"
plain=$(target/release/spillway put "$work/plain.log" | python3 -c "import json,sys; print(json.load(sys.stdin)['digest'])")
secret=$(target/release/spillway put "$work/secrets.log" | python3 -c "import json,sys; print(json.load(sys.stdin)['digest'])")
part 1 && echo "== 1. capped reads, redact=true against plain"
part 1 && for r in $(seq "$rounds"); do
  for blob in plain secret; do
    d=${!blob}
    say "$(with_cpu "$spw" $S --label "$blob plain $r" range --name "$d" --size 52000000 --secs 10)"
    say "$(with_cpu "$spw" $S --label "$blob redact $r" range --name "$d" --size 52000000 --secs 10 --query redact=true)"
  done
done

if part 2; then
echo "== 2. spillway exec of 1 GiB of log lines, redaction on and off"
gen="yes '2026-12-02T10:00:00.000Z INFO svc-1 path=/v1/items/12345 status=200 dur_ms=12' | head -c 1073741824"
on=$(best_of_3 target/release/spillway exec --local "$work/out" -- sh -c "$gen")
off=$(best_of_3 target/release/spillway exec --local "$work/out" --no-redact -- sh -c "$gen")
say "{\"measure\": \"exec_1gib\", \"redact_secs\": ${on% *}, \"no_redact_secs\": ${off% *}}"
fi

if part 3; then
echo "== 3. false alarms"
corpus=${CORPUS:-/tmp/spillway-bench-storage/corpus}
[ -d "$corpus" ] || bench/make-corpus.sh "$corpus" > /dev/null
logs=${LOGS:-/tmp/spillway-search-logs}
files=("$corpus"/* "$work/ids.jsonl" "$work/plain.log")
[ -d "$logs" ] && files+=("$logs"/00*)
say "$(target/release/spillway-redact-scan "${files[@]}")"
fi

python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {r["label"]: r for r in rows if "label" in r}
print("| blob | round | plain p50 ms / CPU µs per read | redact=true p50 ms / CPU µs per read | CPU ratio |")
print("|---|---|---|---|---|")
for k in sorted(by):
    if " plain " in k:
        a, b = by[k], by[k.replace(" plain ", " redact ")]
        print(f"| {k.split()[0]} | {k.split()[-1]} | {a['p50_ms']} / {a['server_cpu_us_per_req']} | {b['p50_ms']} / {b['server_cpu_us_per_req']} | "
              f"{b['server_cpu_us_per_req'] / a['server_cpu_us_per_req']:.2f}x |")
PY
