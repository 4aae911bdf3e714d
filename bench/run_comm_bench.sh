#!/usr/bin/env bash
# comm_bench under mpirun (bench/README.md), its output kept and plotted:
#   bench/run_comm_bench.sh [--np N] [--build DIR] [--out PREFIX] [comm_bench flags...]
# prints comm_bench's tables and writes them to PREFIX.log, and PREFIX.png: bus bandwidth
# against message size per communicator, one panel per operation (bench/plot_bench.py; needs
# python3-matplotlib, scripts/setup.sh --bench). Defaults: 2 ranks, build/, build/comm_bench.
# For example: bench/run_comm_bench.sh --max_bytes 64M --ops all_reduce,all_gather
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
np=2
build="$repo/build"
out=""
args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --np) np=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done
out=${out:-$build/comm_bench}
[[ -x $build/bin/comm_bench ]] || { echo "run_comm_bench: $build/bin/comm_bench not built" >&2; exit 2; }
root=()
[[ $(id -u) -eq 0 ]] && root=(--allow-run-as-root)
mpirun "${root[@]}" --oversubscribe --bind-to none -np "$np" "$build/bin/comm_bench" "${args[@]}" |
  tee "$out.log"
rc=${PIPESTATUS[0]}
/usr/bin/python3 "$repo/bench/plot_bench.py" comm "$out.log" "$out.png"
exit "$rc"
