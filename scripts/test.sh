#!/usr/bin/env bash
# Builds (if needed) and runs the whole test suite: the README's test command and CI's.
set -euo pipefail
cd "$(dirname "$0")/.."
# Ninja (as the quick start configures it); a build/ made before keeps its own generator.
generator=()
[[ -f build/CMakeCache.txt ]] || generator=(-G Ninja)
cmake -S . -B build "${generator[@]}" >/dev/null
cmake --build build -j"$(nproc)"
# Verbose so each test binary's doctest summary (and any skip reason) is printed.
# Multi-rank tests start up to 4 processes each, so tests run one at a time.
ctest --test-dir build --output-on-failure --verbose "$@"
