#!/usr/bin/env bash
# The server's memory under many connections (embedded default, loopback): 1,000 long-polls
# waiting on an empty stream, and beside them 1,000 connections of capped 100 KB reads at random
# offsets of a 50 MB log. Prints the server's resident set (VmRSS) idle, with the polls waiting,
# and its peak (VmHWM) over the whole run, the CPU it spends while the polls only wait, and the
# load generator's JSON lines.
# Usage: bench/run-memory.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/common.sh
. bench/common.sh
bench_setup memory
export SPILLWAY_MAX_CONNECTIONS=4096
start_spillway "$work/spw" 17746
kb() { awk -v k="$1:" '$1 == k {print $2}' "/proc/$spw/status"; }
S="$load --target spillway --url http://127.0.0.1:17746"
log=$($S seed --size 1300000 --lines)
idle=$(kb VmRSS)
$S --concurrency 1000 --label "1,000 long-polls, 30 s each" poll --wait-ms 30000 --count 1000 &
polls=$!
sleep 3 # all connected and waiting
t0=$(cpu_ticks "$spw")
sleep 5
idle_cpu=$(python3 -c "print(round(($(cpu_ticks "$spw") - $t0) / $(getconf CLK_TCK) / 5 * 100, 1))")
waiting=$(kb VmRSS)
$S --concurrency 1000 --label "capped 100 KB read, 1,000 connections, beside the polls" \
  range --name "$log" --size 50000000 --secs 15
during=$(kb VmRSS)
wait $polls
peak=$(kb VmHWM)
echo "{\"cpu_percent_while_1000_polls_wait\": $idle_cpu, \"rss_idle_kib\": $idle, \"rss_with_1000_polls_kib\": $waiting, \"rss_after_reads_kib\": $during, \"rss_peak_kib\": $peak}"
