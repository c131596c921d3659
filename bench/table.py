"""Turns bench/run.sh's JSON lines into the markdown table of docs/benchmarks.md."""
import json, math, statistics, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {r["label"]: r for r in rows}


def cell(r, metric, unit):
    return f'{r[metric]} {unit}, p50 {r["p50_ms"]} ms, p99 {r["p99_ms"]} ms'


print("| scenario | spillway | nginx | ratio (spillway / nginx) | disk, durable | spillway / min(nginx, disk) |")
print("|---|---|---|---|---|---|")
large = []
for r in rows:
    if not r["label"].startswith("spillway "):
        continue
    name = r["label"][len("spillway "):]
    other = by.get("nginx " + name) or by.get("nginx " + name.replace("capped 100 KB read", "100 KB Range GET"))
    disk = by.get("disk " + name)
    metric, unit = ("mib_per_s", "MiB/s") if "PUT" in name or "POST" in name or "full GET" in name else ("req_per_s", "req/s")
    o, ratio, d, bar = "-", "-", "-", "-"
    if other:
        o = cell(other, metric, unit)
        ratio = f"{r[metric] / other[metric]:.2f}x" if other[metric] else "-"
    if disk:
        # The large-PUT rule: >= 0.9x nginx, or 0.9x the disk's durable pace where that is lower.
        d = cell(disk, metric, unit)
        best = min(other[metric], disk[metric]) if other else disk[metric]
        if best:
            bar = f"{r[metric] / best:.2f}x"
            large.append(r[metric] / best)
    print(f"| {name} | {cell(r, metric, unit)} | {o} | {ratio} | {d} | {bar} |")
if large:
    gm = math.exp(sum(math.log(x) for x in large) / len(large))
    print(f"\nlarge PUTs, geometric mean of spillway / min(nginx, disk): {gm:.2f}x")


def p50s(prefix):
    return [r.get("p50_us", r["p50_ms"] * 1000) for r in rows if r["label"].startswith(prefix)]


first, far = p50s("spillway line page at line 1 r"), p50s("spillway line page at line 999000 r")
if first and far:
    a, b = statistics.median(far), statistics.median(first)
    print(f"\nline 999,000 vs line 1 (median of {len(far)} alternated rounds' p50): {a} us / {b} us = {a / b:.2f}x")
