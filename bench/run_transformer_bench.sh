#!/usr/bin/env bash
# The LibTorch transformer under DDP, ZeRO-2 and ZeRO-3 (bench/transformer_bench.cpp), and the
# ZeRO-3 demonstration: a ~405M-parameter model (fp32 AdamW: 16 bytes per parameter, 6.5 GB
# per rank under DDP, 26 GB at world 4) that DDP cannot hold at world 4 within a per-process
# memory limit of a quarter of this machine, and ZeRO-3 trains. Each run prints its table row;
# a run out of memory prints "out of memory on rank R" and fails in seconds, without swapping.
#   bench/run_transformer_bench.sh [BUILD_DIR] [table|demo|all]
# The table is also written to BUILD_DIR/transformer_bench.md and drawn as bars in
# BUILD_DIR/transformer_bench.png (bench/plot_bench.py; needs python3-matplotlib).
set -u
build=${1:-build}
what=${2:-all}
accel=$build/bin/accel
bench=$build/bin/transformer_bench

run() {  # world, distributed type, zero stage (- for none), bench flags...
  local world=$1 type=$2 stage=$3
  shift 3
  local env=(ACCEL_DISTRIBUTED_TYPE="$type")
  [ "$stage" != - ] && env+=(ACCEL_ZERO_STAGE="$stage")
  env "${env[@]}" "$accel" launch --num_processes "$world" "$bench" "$@" 2>&1 |
    grep -E '^\[rank 0\] \| [0-9]|out of memory|transformer_bench:' | sed 's/^\[rank [0-9]*\] //'
}

if [ "$what" != demo ]; then
  # 13.6M parameters: width 512, 4 blocks; every matrix (262k elements and more) sharded.
  shape=(--width 512 --hidden 2048 --blocks 4 --vocab 1024 --context 32 --batch 8 --steps 6)
  {
    echo "| world | strategy | units | parameters | median step | peak RSS per rank |"
    echo "|---|---|---|---|---|---|"
    for world in 2 4; do
      run "$world" MULTI_CPU - "${shape[@]}"
      run "$world" ZERO 2 "${shape[@]}"
      run "$world" ZERO 3 "${shape[@]}" --units wrapper
      run "$world" ZERO 3 "${shape[@]}" --units automatic
      run "$world" ZERO 3 "${shape[@]}" --units root
    done
  } | tee "$build/transformer_bench.md"
  /usr/bin/python3 "$(dirname "$0")/plot_bench.py" transformer "$build/transformer_bench.md" \
    "$build/transformer_bench.png"
fi

if [ "$what" != table ]; then
  # A quarter of the machine's memory per process (virtual: what a process may map at all).
  limit_kib=$(awk '/MemTotal/ {print int($2 / 4)}' /proc/meminfo)
  demo=(--width 2048 --hidden 8192 --blocks 8 --vocab 1024 --context 16 --batch 2 --steps 3)
  echo "demonstration, world 4, ulimit -v $limit_kib KiB per process:"
  # ZeRO-3 twice: the blocks wrapped (ShardedUnit), and the plain model's ModuleList children.
  for strategy in "MULTI_CPU - wrapper" "ZERO 3 wrapper" "ZERO 3 automatic"; do
    set -- $strategy
    start=$(date +%s)
    (ulimit -v "$limit_kib"; run 4 "$1" "$2" "${demo[@]}" --units "$3")
    echo "  ($1 stage $2, units $3: $(( $(date +%s) - start )) s)"
  done
fi
