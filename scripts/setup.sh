#!/usr/bin/env bash
# Installs exactly the Debian packages accelerate-cpp needs that are missing.
# Non-interactive and idempotent; prints nothing when everything is already there.
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  zlib1g-dev
  libgloo-dev
  libopenmpi-dev openmpi-bin
  libboost-program-options-dev
  libyaml-cpp-dev
  doctest-dev
  libtorch-dev
  # LibTorch on Debian's default reference BLAS is 10-15x slower; the pthread OpenBLAS
  # build fights LibTorch's own OpenMP threads, so the OpenMP build is the one to have.
  libopenblas0-openmp
  dataset-fashion-mnist
  iproute2 procps
)

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
