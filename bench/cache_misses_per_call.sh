#!/usr/bin/env bash
# Instruction- and data-cache misses per collective, counted by valgrind's cachegrind on a
# simulated 32 KiB 8-way L1 (this VM class's), for one comm_bench table under mpirun:
#   bench/cache_misses_per_call.sh [--build DIR] [--np N] [--comms C] [--op OP] [--bytes B]
# Defaults: build/, 2 ranks, mpi, all_gather, 4K. comm_bench runs twice, 5000 and 15000
# timed calls after the same warm-up; the difference of the two runs' totals over 10000 is
# per call, so start-up, warm-up and teardown cancel. Prints the mean over the ranks. Under
# cachegrind a call takes ~50x longer, so MPI's polling adds instructions (Ir) that vary
# between runs; the L1 miss counts are the steady figures. Needs valgrind
# (scripts/setup.sh --bench).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$repo/build" np=2 comms=mpi op=all_gather bytes=4K
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --np) np=$2; shift 2 ;;
    --comms) comms=$2; shift 2 ;;
    --op) op=$2; shift 2 ;;
    --bytes) bytes=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "cache_misses_per_call: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
done
command -v valgrind >/dev/null || {
  echo "cache_misses_per_call: valgrind is not installed (scripts/setup.sh --bench)" >&2; exit 2; }
[[ -x $build/bin/comm_bench ]] || {
  echo "cache_misses_per_call: $build/bin/comm_bench not built" >&2; exit 2; }
tunables=$("$repo/bench/worker_tunables.sh" "$build/bin/accel")
root=()
[[ $(id -u) -eq 0 ]] && root=(--allow-run-as-root)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for iters in 5000 15000; do
  GLIBC_TUNABLES=$tunables mpirun "${root[@]}" --oversubscribe --bind-to none -np "$np" \
    -x GLIBC_TUNABLES valgrind -q --tool=cachegrind --cache-sim=yes \
    --I1=32768,8,64 --D1=32768,8,64 \
    --cachegrind-out-file="$work/$iters.%q{OMPI_COMM_WORLD_RANK}" \
    "$build/bin/comm_bench" --comms "$comms" --ops "$op" --min_bytes "$bytes" \
    --max_bytes "$bytes" --iters "$iters" --warmup 100 --check 0 >"$work/$iters.log" 2>&1 || {
    cat "$work/$iters.log" >&2
    echo "cache_misses_per_call: comm_bench failed under cachegrind ($iters calls)" >&2
    exit 1
  }
done

# Each file: "events: Ir I1mr ILmr Dr D1mr ..." then "summary: <counts in that order>".
awk -v np="$np" -v what="$comms $op $bytes, world $np" '
  /^events:/ { for (i = 2; i <= NF; ++i) name[i] = $i; next }
  /^summary:/ {
    sign = (FILENAME ~ /\/15000\./) ? 1 : -1
    for (i = 2; i <= NF; ++i) total[name[i]] += sign * $i
  }
  END {
    calls = 10000 * np
    printf "%s, per call (mean of the ranks)\n", what
    printf "| Ir | I1 misses | D1 read misses | D1 write misses |\n|---|---|---|---|\n"
    printf "| %.0f | %.1f | %.1f | %.1f |\n", total["Ir"] / calls, total["I1mr"] / calls,
      total["D1mr"] / calls, total["D1mw"] / calls
  }' "$work"/5000.* "$work"/15000.*
