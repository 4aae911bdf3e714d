#!/usr/bin/env bash
# Builds (if needed) and runs the whole test suite: the README's test command and CI's.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build >/dev/null
cmake --build build -j"$(nproc)"
# Multi-rank tests start up to 4 processes each; on 2 cores they run one at a time.
ctest --test-dir build --output-on-failure "$@"
