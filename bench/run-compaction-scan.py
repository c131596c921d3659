#!/usr/bin/env python3
"""What a compaction pass and the stored-bytes gauge read in a store of many small blobs.

Builds an SQLite database from migrations/sqlite (the server's schema), fills `blobs` with N small
blobs inline in their rows and M large ones stored as files, then times each query as it was
and as it is now (`inline_data` asked before `layout`, which sits behind a small blob's inline
bytes), and as it would be with a partial index on the pass's three fixed terms (not kept: see
`db::chunks::COMPACTABLE`):
- a compaction pass's walk: the candidates query in pages of 200, in digest order, to the end;
- the gauge's sums over live blobs (`Db::storage_stats`).
Each is timed warm (the file in the page cache: best of 3) and, as root, cold (caches dropped).

    python3 bench/run-compaction-scan.py [SMALL] [LARGE]     (default 200000 300)
"""
import glob
import os
import sqlite3
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = 200  # store-server/src/jobs/compaction.rs
OLD_PASS = ("SELECT digest, size FROM blobs WHERE state = 'live' AND layout = 'raw' AND inline_data IS NULL "
            "AND created_at <= ? AND digest > ? ORDER BY digest LIMIT ?")
NEW_PASS = ("SELECT digest, size FROM blobs WHERE inline_data IS NULL AND state = 'live' "
            "AND layout = 'raw' AND created_at <= ? AND digest > ? ORDER BY digest LIMIT ?")
OLD_STATS = ("SELECT COUNT(*), SUM(size), SUM(CASE WHEN layout = 'raw' THEN size ELSE 0 END) "
             "FROM blobs WHERE state = 'live'")
NEW_STATS = ("SELECT COUNT(*), SUM(size), SUM(CASE WHEN inline_data IS NOT NULL OR layout = 'raw' THEN size ELSE 0 END) "
             "FROM blobs WHERE state = 'live'")


def build(path, small, large):
    c = sqlite3.connect(path)
    c.execute("PRAGMA journal_mode=WAL")
    for f in sorted(glob.glob(os.path.join(ROOT, "migrations/sqlite/*.sql"))):
        c.executescript(open(f).read())
    insert = ("INSERT INTO blobs (digest, sha256, size, lines, line_index, created_at, inline_data, state) "
              "VALUES (?, ?, ?, ?, ?, ?, ?, 'live')")
    c.executemany(insert, ((os.urandom(32).hex(), os.urandom(32).hex(), 4096, 80, b"", i, os.urandom(4096))
                           for i in range(small)))
    c.executemany(insert, ((os.urandom(32).hex(), os.urandom(32).hex(), 1 << 20, 9000, b"", i, None)
                           for i in range(large)))
    c.commit()
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    c.close()


def walk(c, sql):
    after, found = "", 0
    while True:
        page = c.execute(sql, (1 << 62, after, PAGE)).fetchall()
        found += len(page)
        if len(page) < PAGE:
            return found
        after = page[-1][0]


def timed(path, run, cold):
    best = None
    for _ in range(1 if cold else 3):
        if cold:
            os.sync()
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
        c = sqlite3.connect(path)
        t = time.perf_counter()
        out = run(c)
        dt = time.perf_counter() - t
        c.close()
        best = dt if best is None else min(best, dt)
    return best, out


def main():
    small = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    large = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    cold_too = os.geteuid() == 0
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "spillway.db")
        build(path, small, large)
        print(f"sqlite {sqlite3.sqlite_version}; {small} small blobs inline, {large} large; "
              f"database {os.path.getsize(path) / 2**20:.0f} MiB")
        print("| what | query | warm ms | cold ms | result |")
        print("|---|---|---|---|---|")
        rows = []
        for label, sql in (("as it was", OLD_PASS), ("now", NEW_PASS), ("with a partial index", NEW_PASS)):
            if label == "with a partial index":
                c = sqlite3.connect(path)
                c.execute("CREATE INDEX blobs_compactable ON blobs (digest) "
                          "WHERE inline_data IS NULL AND state = 'live' AND layout = 'raw'")
                c.close()
            for name, run in (("a compaction pass's walk", lambda c, s=sql: walk(c, s)),
                              ("the stored-bytes sums", lambda c, s=(OLD_STATS if label == "as it was" else NEW_STATS):
                               c.execute(s).fetchone())):
                warm, out = timed(path, run, False)
                cold = timed(path, run, True)[0] if cold_too else None
                rows.append((name, label, warm, cold, out))
        for name, label, warm, cold, out in sorted(rows, key=lambda r: r[0]):
            cold_ms = f"{cold * 1000:.0f}" if cold is not None else "–"
            print(f"| {name} | {label} | {warm * 1000:.1f} | {cold_ms} | {out} |")


if __name__ == "__main__":
    main()
