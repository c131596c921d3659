"""Turns bench/run.sh's JSON lines into the markdown table of docs/benchmarks.md."""
import json, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {r["label"]: r for r in rows}
print("| scenario | spillway | nginx | ratio (spillway / nginx) |")
print("|---|---|---|---|")
for r in rows:
    if not r["label"].startswith("spillway "):
        continue
    name = r["label"][len("spillway "):]
    other = by.get("nginx " + name) or by.get("nginx " + name.replace("capped 100 KB read", "100 KB Range GET"))
    if "PUT" in name or "full GET" in name:
        metric = "mib_per_s"
        unit = "MiB/s"
    else:
        metric = "req_per_s"
        unit = "req/s"
    s = f'{r[metric]} {unit}, p50 {r["p50_ms"]} ms, p99 {r["p99_ms"]} ms'
    if other:
        o = f'{other[metric]} {unit}, p50 {other["p50_ms"]} ms, p99 {other["p99_ms"]} ms'
        ratio = f'{r[metric] / other[metric]:.2f}x' if other[metric] else "-"
    else:
        o, ratio = "-", "-"
    print(f"| {name} | {s} | {o} | {ratio} |")
l1 = by.get("spillway line page at line 1")
lf = by.get("spillway line page at line 999000")
if l1 and lf:
    print(f'\nline 999,000 vs line 1 (p50): {lf["p50_ms"]} ms / {l1["p50_ms"]} ms = {lf["p50_ms"] / l1["p50_ms"]:.2f}x')
