#!/usr/bin/env bash
# Installs exactly the Debian packages accelerate-cpp needs that are missing.
# Non-interactive and idempotent; prints nothing when everything is already there.
#
#   scripts/setup.sh           what the build and the tests need
#   scripts/setup.sh --bench   also what the benchmarks compare against and draw with:
#                              Debian's python3-torch (PyTorch's own DDP,
#                              bench/run_step_bench.sh), python3-matplotlib (bench/'s plots)
#                              and valgrind (bench/cache_misses_per_call.sh)
set -euo pipefail

bench=0
for arg in "$@"; do
  case "$arg" in
    --bench) bench=1 ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup: unknown argument '$arg' (--bench, --help)" >&2; exit 2 ;;
  esac
done

packages=(
  build-essential cmake ninja-build pkg-config git
  zlib1g-dev
  libgloo-dev
  libopenmpi-dev openmpi-bin
  libyaml-cpp-dev
  doctest-dev
  libtorch-dev
  # LibTorch on Debian's default reference BLAS is 10-15x slower; the pthread OpenBLAS
  # build fights LibTorch's own OpenMP threads, so the OpenMP build is the one to have.
  libopenblas0-openmp
  dataset-fashion-mnist
  iproute2 procps
  # format_test: the tree as Debian 12's clang-format (14) formats it
  clang-format
  # tensorboard_events_test: Google's protobuf decodes the event files written
  python3-protobuf
)
# Benchmarks only: baselines and tools (about 20 packages, mostly Python); the Python is
# /usr/bin/python3.
[[ $bench -eq 1 ]] && packages+=(python3-torch python3-matplotlib valgrind)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "installed" ]] || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "setup: installing ${missing[*]}"
sudo_cmd=()
[[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
