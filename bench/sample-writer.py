#!/usr/bin/env python3
"""Samples the SQLite writer thread of a spillway-server while bloadgen uploads to it.

    python3 bench/sample-writer.py & ONLY=a,b ../shared/bench/ratio-vs-nginx

(it exits when the server it found does).

Waits for a server started with --listen and --data-dir (as the yardstick starts it), then,
during each `bloadgen put` against that server's address, reads the writer thread's state and
kernel wait channel every millisecond for 4.5 s (/proc/PID/task/TID/stat, wchan) and prints,
per run: the share of samples idle (S), on a core or waiting for one (R) and blocked in the
kernel (D), the thread's run and run-queue time from schedstat, and the most common
(state, wait channel) pairs. Linux only; reads /proc, changes nothing.
"""
import collections
import glob
import os
import time


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def find_server():
    for path in glob.glob("/proc/[0-9]*"):
        c = cmdline(os.path.basename(path))
        if b"--listen" in c and b"--data-dir" in c:
            return os.path.basename(path), c[c.index(b"--listen") + 1].decode()
    return None, None


def writer_thread(pid):
    for t in glob.glob(f"/proc/{pid}/task/*"):
        with open(t + "/comm") as f:
            if f.read().startswith("spillway-db-wri"):
                return t
    return None


def loading(addr):
    for path in glob.glob("/proc/[0-9]*"):
        c = cmdline(os.path.basename(path))
        if len(c) > 1 and c[0].endswith(b"bloadgen") and c[1] == b"put" and addr.encode() in c:
            return True
    return False


def main():
    pid = None
    while pid is None:
        pid, addr = find_server()
        time.sleep(0.5)
    writer = None
    while writer is None and os.path.exists(f"/proc/{pid}"):
        writer = writer_thread(pid)
        time.sleep(0.1)
    print(f"server {pid} on {addr}, writer {writer}", flush=True)
    while writer and os.path.exists(f"/proc/{pid}"):
        if not loading(addr):
            time.sleep(0.2)
            continue
        states, waits, n = collections.Counter(), collections.Counter(), 0
        with open(writer + "/schedstat") as f:
            s0 = [int(x) for x in f.read().split()]
        t0 = time.time()
        while time.time() - t0 < 4.5:
            try:
                with open(writer + "/stat") as f:
                    stat = f.read()
                with open(writer + "/wchan") as f:
                    wchan = f.read()
            except OSError:
                break
            state = stat[stat.rindex(")") + 2]
            states[state] += 1
            waits[(state, wchan)] += 1
            n += 1
            time.sleep(0.001)
        if n == 0:
            break
        with open(writer + "/schedstat") as f:
            s1 = [int(x) for x in f.read().split()]
        shares = {k: round(v / n, 3) for k, v in sorted(states.items())}
        print(f"run: {n} samples {shares} on a core {(s1[0] - s0[0]) / 1e9:.2f} s, "
              f"waiting for one {(s1[1] - s0[1]) / 1e9:.2f} s", flush=True)
        print("    ", waits.most_common(8), flush=True)
        while loading(addr):
            time.sleep(0.2)


if __name__ == "__main__":
    main()
