#!/usr/bin/env python3
"""What the yardstick's per-request goals ask of the server's CPU on this machine.

Reads the output of `../shared/bench/ratio-vs-nginx` (a file, or stdin) and, from its own rates and
cores columns, prints for the capped read and the 4 KiB PUT: the server's CPU per request now, and
what it may spend at the goal's rate.

- Capped read (goal 0.8): the load generator keeps every core busy, so a rate is the cores over the
  CPU per read of the server plus that of the rest (the load generator, the kernel's delivery).
  Holding the rest's share at what this run measured, the server's budget per read at 0.8 of
  nginx's rate is `cores / (0.8 * nginx rate) - rest`.
- 4 KiB PUT (goal 0.5): the server is not CPU-bound there (its writer waits for the disk), so the
  script prints the cores that the goal's rate would take at this run's CPU per upload.

Usage: bench/yardstick-budget.py [yardstick output]   Env: CORES (default: this machine's).
"""
import os
import re
import sys


def row(text, label):
    """(nginx rate, ours rate, nginx cores, ours cores) of the table row starting with `label`."""
    for line in text.splitlines():
        if line.startswith("| " + label):
            cells = [c.strip().replace(",", "") for c in line.strip().strip("|").split("|")]
            return float(cells[2]), float(cells[3]), float(cells[5]), float(cells[6])
    sys.exit(f"no row {label!r} in the yardstick's output")


def main():
    text = open(sys.argv[1]).read() if len(sys.argv) > 1 else sys.stdin.read()
    cores = float(os.environ.get("CORES", os.cpu_count()))
    line = re.search(r"^ours/nginx:.*$", text, re.M)
    if line:
        print(line.group(0))

    n_rate, o_rate, n_cores, o_cores = row(text, "(c) 100,000-byte range reads")
    n_us, o_us = n_cores / n_rate * 1e6, o_cores / o_rate * 1e6
    rest = (cores - o_cores) / o_rate * 1e6
    budget = cores / (0.8 * n_rate) * 1e6 - rest
    print(
        f"capped read: nginx {n_us:.1f} us of CPU per read, ours {o_us:.1f} (rest of the machine {rest:.1f}); "
        f"at 0.8 of nginx ours may spend {budget:.1f} us, {budget / o_us:.2f} of now, {budget / n_us:.2f}x nginx's"
    )

    n_rate, o_rate, n_cores, o_cores = row(text, "(b) PUT 4 KiB, 16 conns")
    n_us, o_us = n_cores / n_rate * 1e6, o_cores / o_rate * 1e6
    goal = 0.5 * n_rate
    print(
        f"4 KiB PUT: nginx {n_us:.1f} us of CPU per upload, ours {o_us:.1f}; 0.5 of nginx is {goal:,.0f}/s, "
        f"which at ours' CPU per upload takes {goal * o_us / 1e6:.2f} of {cores:.0f} cores"
    )


main()
