#!/usr/bin/env bash
# The checks that need a GPU, for a machine that has one (the development machine has none, so
# these tests report themselves skipped there). Builds only what the checks need in build-gpu
# (sm_90, the H200), runs the tests, prints each binary's results. A few minutes on 16 cores.
#
#   scripts/gpu_check.sh                 every section
#   scripts/gpu_check.sh --data DIR      Fashion-MNIST's .gz files in DIR instead of
#                                        /usr/share/datasets/fashion-mnist (raw_cuda_test)
# Exit status: non-zero when a build or a test failed; a test skipped on a GPU machine is
# reported, since there it means something is missing.
set -uo pipefail
cd "$(dirname "$0")/.."

data=""
while [ $# -gt 0 ]; do
  case "$1" in
    --data) data="$2"; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1' (--data DIR, --help)" >&2; exit 2 ;;
  esac
done
[ -n "$data" ] && export ACCEL_TEST_FASHION_MNIST="$data"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
status=0
cmake -S . -B build-gpu -DCMAKE_CUDA_ARCHITECTURES=90 -DACCEL_BUILD_BENCH=OFF >build-gpu.cmake.log 2>&1 \
  || { echo "gpu_check: cmake failed (build-gpu.cmake.log)"; tail -20 build-gpu.cmake.log; exit 1; }
grep "accelerate-cpp:" build-gpu.cmake.log

# Runs ctest on the tests matching $1, printing every binary's doctest summary and skip reasons.
run_tests() {
  ctest --test-dir build-gpu -R "$1" --output-on-failure --verbose 2>&1 \
    | grep -E "SKIPPED|ERROR|FAILED|CHECK|REQUIRE|test cases:|assertions:|Passed|Failed|\*\*\*|tests passed" \
    | sed 's/^[0-9]*: //'
  return "${PIPESTATUS[0]}"
}

# --- cudak: the optimizer/clipping/loss-scaling kernels and examples/raw_cuda ---
echo "== cudak: cuda_kernels_test, raw_cuda_test =="
if cmake --build build-gpu -j"$(nproc)" --target cuda_kernels_test raw_cuda_test raw_cuda >build-gpu.cudak.log 2>&1; then
  run_tests '^(cuda_kernels_test|raw_cuda_test)$' | tee build-gpu.cudak.tests.log
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  grep -q "Skipped" build-gpu.cudak.tests.log \
    && echo "gpu_check: WARNING: a test skipped on the GPU machine (the SKIPPED line says why)" 
  # One short training run to see it work end to end (fp16, the loss per 20 steps).
  ACCEL_COMM_BACKEND=nccl timeout 300 build-gpu/bin/raw_cuda --epochs 1 --max_steps 200 --log_every 20 \
    --mixed_precision fp16 ${data:+--data_dir "$data"} || status=1
else
  echo "gpu_check: cudak build failed (build-gpu.cudak.log)"; tail -30 build-gpu.cudak.log; status=1
fi

exit $status
