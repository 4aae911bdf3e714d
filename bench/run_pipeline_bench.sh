#!/usr/bin/env bash
# Pipeline parallelism's step against one process's (bench/pipeline_bench.cpp): for each
# micro-batch count M, the reference (one process, the whole MLP, M micro-batches accumulated),
# then P = 2 stages under every schedule, each row with its step over the ideal (the
# reference's step / P) and its bubble: measured, modelled from the measured action times, and
# the formula. The table is also written to BUILD_DIR/pipeline_bench.md.
#   bench/run_pipeline_bench.sh [BUILD_DIR] [M...]
set -eu
build=${1:-build}
shift || true
counts=("$@")
[ ${#counts[@]} -eq 0 ] && counts=(4 8 16 32)
accel=$build/bin/accel
bench=$build/bin/pipeline_bench
stages=2
{
  echo "| P | schedule | M | median step | / ideal | idle measured | idle model | idle formula |"
  echo "|---|---|---|---|---|---|---|---|"
  for m in "${counts[@]}"; do
    row=$("$bench" --reference --microbatches "$m")
    echo "$row"
    ideal=$(echo "$row" | awk -F'|' -v p=$stages '{ split($5, t, " "); printf "%.4f", t[1] / p }')
    for schedule in GPIPE 1F1B "INTERLEAVED_1F1B --chunks 2" ZERO_BUBBLE; do
      # shellcheck disable=SC2086  # the chunks flag rides along with its schedule
      "$accel" launch -q --num_processes $stages --main_process_port 0 "$bench" \
        --microbatches "$m" --ideal_ms "$ideal" --schedule $schedule | sed 's/^\[rank 0\] //'
    done
  done
} | tee "$build/pipeline_bench.md"
