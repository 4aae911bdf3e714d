#!/usr/bin/env bash
# The GPU check of DDP/ZeRO on CUDA buffers over NCCL (one GPU, world of one), for a machine
# with a GPU (the lead merges it with the kernels' part into scripts/gpu_check.sh):
#   builds only what it runs (build-gpu, sm_90), then runs
#   - device_order_test and strategy_device_test (the device side; with a GPU the CUDA
#     round trip of device_memory runs too),
#   - nccl_test (the collective matrix over NCCL; DDP and ZeRO-1/2 with CUDA parameters vs
#     the host loop; ZeRO offload on/off),
#   - comm_bench's nccl table (our NCCL communicator, device buffers) at world 1.
# Prints each result; exits non-zero when a test failed. A few minutes on 16 cores.
set -uo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
status=0
step() { echo; echo "=== $*"; }

step "configure (build-gpu)"
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 >build-gpu.configure.log 2>&1 ||
  { tail -40 build-gpu.configure.log; exit 1; }
grep -E "accelerate-cpp: found" build-gpu.configure.log || true

step "build"
cmake --build build-gpu -j"$jobs" --target nccl_test comm_collectives_worker device_order_test \
  strategy_device_test comm_bench 2>&1 | tail -5
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "build failed"; exit 1; }

step "nvidia-smi"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

for t in device_order_test strategy_device_test nccl_test; do
  step "ctest $t"
  timeout 600 ctest --test-dir build-gpu -R "^${t}\$" --output-on-failure --verbose >"build-gpu/$t.log" 2>&1
  rc=$?
  grep -E "SKIPPED|test cases:|assertions:|Passed|Failed|Skipped" "build-gpu/$t.log" | tail -12
  [ $rc -eq 0 ] || { status=1; tail -60 "build-gpu/$t.log"; }
  # On this machine nothing may be skipped: a skip means the GPU was not usable.
  if [ "$t" = nccl_test ] && grep -q "SKIPPED" "build-gpu/$t.log"; then
    echo "nccl_test skipped on the GPU machine: counted as a failure"
    status=1
  fi
done

step "comm_bench over nccl, world 1 (1 GPU)"
# Rank and world from the environment a launcher would set; the store is hosted by rank 0.
RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29531 \
  timeout 300 build-gpu/bin/comm_bench --comms nccl --min_bytes 4K --max_bytes 256M || status=1

step "result: $([ $status -eq 0 ] && echo PASS || echo FAIL)"
exit $status
