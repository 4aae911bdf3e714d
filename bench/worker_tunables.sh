#!/usr/bin/env bash
# Prints the GLIBC_TUNABLES `accel launch` gives its CPU workers, asked of it, for the bench
# scripts' processes that it does not start itself (a bare mpirun, plain LibTorch).
# usage: bench/worker_tunables.sh ACCEL_BINARY
set -euo pipefail
accel=${1:?usage: worker_tunables.sh ACCEL_BINARY}
value=$("$accel" launch -q --num_machines 1 --num_processes 1 --use_cpu --main_process_port 0 \
  /usr/bin/printenv GLIBC_TUNABLES) || {
  echo "worker_tunables: could not ask $accel launch for its GLIBC_TUNABLES" >&2
  exit 2
}
echo "${value#\[rank 0\] }"
