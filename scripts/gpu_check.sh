#!/usr/bin/env bash
# The checks that need a GPU, for a machine that has one (the development machine has none:
# there it builds, reports every test SKIP with the reason, and exits 1). One build directory,
# build-gpu (sm_90, the H200; no LibTorch, no benchmarks but comm_bench), only the targets the
# checks run, then each test and comm_bench's nccl table at world 1, one summary line each.
# Well under 8 minutes on a 16-core H200 machine, the build included.
#
#   scripts/gpu_check.sh                 every check
#   scripts/gpu_check.sh --data DIR      Fashion-MNIST's .gz files in DIR instead of
#                                        /usr/share/datasets/fashion-mnist (raw_cuda_test)
#
# Tests: cuda_kernels_test (the optimizer/clipping/unscale/DataParallel-sum kernels against the
# CPU loops), data_parallel_cuda_test (DataParallel's GPU replicas: 2 and 3 sharing GPU 0, and
# GPUs 0/1 when there are two), raw_cuda_test (examples/raw_cuda under DDP, ZeRO 1/2, fp16,
# bf16, checkpoint resume, one process without NCCL and DataParallel over one GPU),
# device_order_test and strategy_device_test (the device side of the communicator and the
# strategies), nccl_test (the collective matrix; DDP and ZeRO-1/2 on CUDA parameters with the
# kernels on a non-blocking compute stream vs the host loop; ZeRO offload).
# Exit status: 0 only when every test passed. A test skipped on a machine with a GPU is a
# failure (it means something is missing); without a GPU the script says so and exits 1.
# Logs: build-gpu/<test>.log, build-gpu/cmake.log, build-gpu/build.log, build-gpu/comm_bench.log.
set -uo pipefail
cd "$(dirname "$0")/.."

data=""
while [ $# -gt 0 ]; do
  case "$1" in
    --data) data="$2"; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1' (--data DIR, --help)" >&2; exit 2 ;;
  esac
done
[ -n "$data" ] && export ACCEL_TEST_FASHION_MNIST="$data"

tests=(cuda_kernels_test data_parallel_cuda_test raw_cuda_test device_order_test strategy_device_test nccl_test)
# What they run besides themselves: raw_cuda (raw_cuda_test), comm_collectives_worker
# (nccl_test), comm_bench.
targets=("${tests[@]}" raw_cuda comm_collectives_worker comm_bench)
jobs=$(nproc)
started=$SECONDS

if gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null) \
   && [ -n "$gpu" ]; then
  echo "gpu_check: GPU: $gpu"
  have_gpu=1
else
  echo "gpu_check: no GPU visible (nvidia-smi finds none): building, then every test reports SKIP"
  have_gpu=0
fi

# LibTorch is not needed by any of these (and Debian's is CPU-only): not even looked for.
mkdir -p build-gpu
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DACCEL_WITH_TORCH=OFF -DACCEL_BUILD_TESTS=ON -DACCEL_BUILD_EXAMPLES=ON -DACCEL_BUILD_BENCH=ON \
  >build-gpu/cmake.log 2>&1 \
  || { echo "gpu_check: cmake failed (build-gpu/cmake.log)"; tail -20 build-gpu/cmake.log; exit 1; }
grep "accelerate-cpp:" build-gpu/cmake.log
if ! grep -q "cuda kernels (nvcc" build-gpu/cmake.log || ! grep -q "nccl (cuda" build-gpu/cmake.log; then
  echo "gpu_check: FAIL: this build has no CUDA kernels or no NCCL communicator (line above)"
  exit 1
fi
if ! cmake --build build-gpu -j"$jobs" --target "${targets[@]}" >build-gpu/build.log 2>&1; then
  echo "gpu_check: FAIL: build (build-gpu/build.log):"
  grep -E "error|Error" build-gpu/build.log | head -30
  exit 1
fi
echo "gpu_check: built ${targets[*]} in $((SECONDS - started)) s"

status=0
summary=()
for t in "${tests[@]}"; do
  t0=$SECONDS
  timeout 600 ctest --test-dir build-gpu -R "^${t}\$" --output-on-failure --verbose \
    >"build-gpu/$t.log" 2>&1
  rc=$?
  if grep -q "SKIPPED\|\*\*\*Skipped" "build-gpu/$t.log" && [ $rc -eq 0 ]; then
    reason=$(grep -m1 "SKIPPED" "build-gpu/$t.log" | sed 's/^[0-9]*: //; s/^SKIPPED: //')
    verdict="SKIP ($reason)"
    [ $have_gpu -eq 1 ] && { verdict="FAIL: skipped on a GPU machine ($reason)"; status=1; }
  elif [ $rc -eq 0 ]; then
    verdict="PASS"
  else
    verdict="FAIL (rc $rc)"
    status=1
    grep -E "ERROR|FAILED|CHECK|REQUIRE|test cases:" "build-gpu/$t.log" | sed 's/^[0-9]*: //' | head -20
  fi
  summary+=("$(printf '%-22s %s (%d s)' "$t" "$verdict" $((SECONDS - t0)))")
  echo "gpu_check: ${summary[-1]}"
done

# comm_bench's nccl table at world 1 (our communicator on device buffers), the launcher's
# environment by hand; the store is hosted by rank 0.
t0=$SECONDS
if [ $have_gpu -eq 1 ]; then
  if RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29531 \
       timeout 300 build-gpu/bin/comm_bench --comms nccl --min_bytes 4K --max_bytes 256M \
       >build-gpu/comm_bench.log 2>&1; then
    verdict="PASS"
    cat build-gpu/comm_bench.log
  else
    verdict="FAIL"
    status=1
    tail -20 build-gpu/comm_bench.log
  fi
else
  verdict="SKIP (no GPU)"
fi
summary+=("$(printf '%-22s %s (%d s)' "comm_bench nccl" "$verdict" $((SECONDS - t0)))")

echo
echo "== gpu_check summary ($((SECONDS - started)) s in all)"
printf '%s\n' "${summary[@]}"
if [ $have_gpu -eq 0 ]; then
  echo "gpu_check: no GPU on this machine: nothing was checked on a GPU (exit 1)"
  exit 1
fi
echo "gpu_check: $([ $status -eq 0 ] && echo PASS || echo FAIL)"
exit $status
