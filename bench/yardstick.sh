# Sourced by the scripts that run the yardstick's capped read outside it
# (profile-yardstick-read.sh, run-ab-yardstick-read.sh).
# yardstick_read_setup WORK NAME: empties WORK, builds the yardstick's load generator (offline)
# into it and sets `bloadgen`; writes its 50 MiB printable-text object, named NAME, to WORK/obj.
# The yardstick is ../shared/bench, or YARDSTICK.
yardstick_read_setup() {
  local work=$1 name=$2 peers
  peers=$(cd "${YARDSTICK:-../shared/bench}/peers" && pwd)
  rm -rf "$work"; mkdir -p "$work"
  cargo build --release --offline -q --manifest-path "$peers/loadgen/Cargo.toml" --target-dir "$work/loadgen"
  bloadgen=$work/loadgen/release/bloadgen
  python3 - "$peers" "$work/obj" "$name" <<'PY'
import importlib.util, sys
peers, out, name = sys.argv[1:4]
spec = importlib.util.spec_from_file_location("bench", peers + "/bench.py")
bench = importlib.util.module_from_spec(spec); sys.argv = sys.argv[:1]; spec.loader.exec_module(bench)
open(out, "wb").write(bench.text_object(name, 50 << 20))
PY
}
