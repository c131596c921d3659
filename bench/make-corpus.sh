#!/usr/bin/env bash
# Makes a corpus of agent-style tool outputs from real commands run on this machine, for the
# storage benchmarks (bench/run-storage.sh): build-tool and test output, listings, package
# databases, disassembly, git history, JSON logs — and, as agents make them all day, the same
# commands run again (a tool echoes the command and when it ran, and timings and counters
# move, so no re-run is the same bytes) and long outputs read again as they grow (a log saved
# at every eighth of its length). About 350 MiB in 150+ files.
#   bench/make-corpus.sh DIR
set -eu   # not pipefail: a command whose output `cap` cuts ends with SIGPIPE, as it should
out=${1:?usage: bench/make-corpus.sh DIR}
rm -rf "$out" && mkdir -p "$out"
# Each output's name starts with its number (the count is kept in a file: `save` runs at the
# end of a pipeline, in a subshell).
save() {
  local n=$(( $(cat "$out/.count" 2>/dev/null || echo 0) + 1 ))
  echo $n > "$out/.count"
  cat > "$out/$(printf '%03d' $n)-$1"
}
cap() { head -c "${1}"; }   # keep an output to a size an agent tool might produce

# Build and test output: the workspace's own, verbose (re-run twice: timings and hashes move).
for run in 1 2; do
  touch store-api/src/lib.rs   # one crate compiled again: its rustc command lines and timings
  cargo build -p spillway-api --features paging,openapi -v --color never 2>&1 | cap 20M | save "cargo-build-v-$run.log" || true
  cargo test --workspace --no-run -v --color never 2>&1 | cap 20M | save "cargo-test-build-$run.log" || true
  cargo tree --workspace -e features --color never 2>&1 | save "cargo-tree-$run.txt"
done
cargo metadata --format-version 1 2>/dev/null | python3 -m json.tool | save "cargo-metadata.json"

# Listings and package databases, three times each (a command an agent runs again later; the tool
# echoes the command and when it ran, so no two runs are the same bytes).
run_cmd() { echo "\$ $* # $(date -u +%FT%T.%NZ)"; "$@" 2>/dev/null; }
for run in 1 2 3; do
  run_cmd ls -laR --time-style=full-iso /usr/share | cap 40M | save "ls-laR-usr-share-$run.txt"
  run_cmd find /usr/lib -xdev -printf '%M %n %u %s %TY-%Tm-%Td %TT %p\n' | cap 40M | save "find-usr-lib-$run.txt"
  run_cmd find /usr/include /usr/src -xdev -type f -printf '%s %p\n' | cap 40M | save "find-include-$run.txt"
  run_cmd ps -eo pid,ppid,user,%cpu,%mem,rss,vsz,stat,lstart,cmd --sort=-rss | save "ps-$run.txt"
  run_cmd env | sed 's/=.*/=…/' | save "env-names-$run.txt"
done
dpkg -l | save "dpkg-l.txt"
dpkg-query -W -f='${Package} ${Version} ${Installed-Size}\n${Description}\n\n' | save "dpkg-query.txt"
for p in $(dpkg-query -W -f='${Package}\n' | head -400); do dpkg -L "$p" 2>/dev/null; done | save "dpkg-L.txt"

# Disassembly and symbols of binaries on this machine (large text, like a build's output).
for b in $(ls -S /usr/bin | head -12 | sed 's|^|/usr/bin/|'); do
  file -L "$b" 2>/dev/null | grep -q ELF || continue
  objdump -d --no-show-raw-insn "$(readlink -f "$b")" 2>/dev/null | cap 12M | save "objdump-$(basename "$b").txt"
  nm -D --defined-only "$(readlink -f "$b")" 2>/dev/null | save "nm-$(basename "$b").txt" || true
done

# History: the project's own git log, saved as it grows (an agent reading a log again later).
git log --stat --format=fuller 2>/dev/null | save "git-log-stat.txt"
git log -p --format=fuller 2>/dev/null | cap 60M | save "git-log-p.txt"

# JSON logs in the shape a k8s pod writes, from this machine's own files: one line per file.
python3 - "$out" <<'PY'
import json, os, sys, time, uuid
out = sys.argv[1]
files = []
for root, _, names in os.walk("/usr"):
    for name in names:
        files.append(os.path.join(root, name))
        if len(files) >= 300_000:
            break
    if len(files) >= 300_000:
        break
t0 = 1764655200.0
for part in range(4):
    lines = []
    for i, path in enumerate(files[part * 60_000:(part + 1) * 60_000]):
        try:
            st = os.lstat(path)
        except OSError:
            continue
        lines.append(json.dumps({
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t0 + i * 0.013)) + ".%03dZ" % (i % 1000),
            "level": "info" if i % 17 else "warn", "pod": f"indexer-{part}-7d9f8", "trace_id": uuid.UUID(int=(i * 2654435761) % (1 << 128)).hex,
            "msg": "indexed file", "path": path, "size": st.st_size, "mode": oct(st.st_mode), "mtime": int(st.st_mtime),
        }))
    with open(os.path.join(out, f"9{part:02d}-k8s-indexer-{part}.jsonl"), "w") as f:
        f.write("\n".join(lines) + "\n")
PY

# Long outputs read again as they grow: seven more snapshots of each (1/8 … 7/8 of it).
for src in $(ls "$out"/*-objdump-*.txt | head -3) "$out"/*-git-log-p.txt "$out"/*-find-usr-lib-1.txt "$out"/9*-k8s-indexer-0.jsonl; do
  size=$(stat -c %s "$src")
  [ "$size" -gt 1000000 ] || continue
  for eighth in 1 2 3 4 5 6 7; do
    head -c $((size * eighth / 8)) "$src" | save "$(basename "$src" | cut -d- -f2-)-at-$eighth-8.snapshot"
  done
done

# Some binary: compressed files, and executables.
for f in $(ls /usr/share/doc/*/changelog.Debian.gz 2>/dev/null | head -60); do cat "$f"; done | save "changelogs.gz.bin"
head -c 8000000 "$(readlink -f /usr/bin/python3.11)" | save "python3.11.bin"

# Many small outputs, as most tool calls make.
for i in $(seq 1 40); do
  { echo "\$ cargo test -p spillway-api -- paging::tests::case_$i"; seq 1 $((i * 211)) | sed "s/^/test paging::case_$i::n/; s/$/ ... ok/"; \
    echo "test result: ok. $((i * 211)) passed; 0 failed; finished in 0.$i s"; } | save "small-test-$i.log"
done

rm -f "$out/.count"
ls "$out" | wc -l | xargs echo files:
du -sb "$out" | awk '{printf "bytes: %d (%.0f MiB)\n", $1, $1 / 1048576}'
