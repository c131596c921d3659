#!/usr/bin/env python3
"""Writes N log outputs of about SIZE bytes each into DIR, for bench/run-search.sh: service
logs as agents grep them (timestamps, request ids, paths, durations), every output distinct.
Every 1,000th line holds the common pattern `retrying`; one output, in its middle, holds the
rare one `OOMKilled`.
  bench/make-logs.py DIR N SIZE"""
import os, random, sys

out, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.makedirs(out, exist_ok=True)
rng = random.Random(42)
levels = ["INFO"] * 8 + ["DEBUG", "WARN"]
paths = ["/v1/items", "/v1/users", "/v1/orders", "/healthz", "/v1/search", "/v1/blobs"]
rare = n // 2
for i in range(n):
    lines, total, k = [], 0, 0
    while total < size:
        k += 1
        if k % 1000 == 0:
            line = f"2026-12-02T10:{k // 60000 % 60:02}:{k // 1000 % 60:02}.{k % 1000:03}Z WARN svc-{i % 17} upstream=db-{k % 5} retrying connection after {k % 97} ms attempt={k % 7}\n"
        elif i == rare and k == 4321:
            line = f"2026-12-02T10:00:05.000Z ERROR svc-{i % 17} container=worker-{i} reason=OOMKilled exit_code=137\n"
        else:
            line = (f"2026-12-02T10:{k // 60000 % 60:02}:{k // 1000 % 60:02}.{k % 1000:03}Z {rng.choice(levels)} svc-{i % 17} "
                    f"req={rng.getrandbits(64):016x} path={rng.choice(paths)}/{rng.randrange(100000)} status={rng.choice((200, 200, 200, 201, 404, 500))} "
                    f"dur_ms={rng.randrange(1, 900)} bytes={rng.randrange(50, 90000)}\n")
        lines.append(line)
        total += len(line)
    with open(os.path.join(out, f"{i:04}.log"), "w") as f:
        f.write("".join(lines))
