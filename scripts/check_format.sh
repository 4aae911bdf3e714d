#!/usr/bin/env bash
# The tree's C, C++ and CUDA files as clang-format 14 (Debian 12's) formats them with the
# committed .clang-format. Lists the files that differ and exits 1; exits 77 (ctest: skipped)
# without clang-format 14, whose output other versions do not reproduce.
#
#   scripts/check_format.sh         check (format_test in ctest runs this)
#   scripts/check_format.sh --fix   rewrite the files that differ
set -euo pipefail
cd "$(dirname "$0")/.."

fix=0
case "${1:-}" in
  --fix) fix=1 ;;
  "") ;;
  *) echo "check_format: unknown argument '$1' (--fix)" >&2; exit 2 ;;
esac

fmt=$(command -v clang-format-14 || command -v clang-format || true)
if [[ -z "$fmt" ]] || ! "$fmt" --version | grep -q 'version 14\.'; then
  echo "SKIPPED: clang-format 14 not found (scripts/setup.sh installs it)"
  exit 77
fi

# Tracked files, or every source file where this is not a git checkout.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files -- '*.cpp' '*.hpp' '*.cu' '*.c' '*.h')
else
  mapfile -t files < <(find . -path ./build -prune -o \( -name '*.cpp' -o -name '*.hpp' \
    -o -name '*.cu' -o -name '*.c' -o -name '*.h' \) -print | sed 's|^\./||')
fi

if [[ $fix -eq 1 ]]; then
  "$fmt" -i --style=file "${files[@]}"
  exit 0
fi
drift=()
for f in "${files[@]}"; do
  "$fmt" --style=file --dry-run --Werror "$f" >/dev/null 2>&1 || drift+=("$f")
done
if [[ ${#drift[@]} -gt 0 ]]; then
  echo "check_format: ${#drift[@]} of ${#files[@]} files differ from clang-format's output; run scripts/check_format.sh --fix:"
  printf '  %s\n' "${drift[@]}"
  exit 1
fi
echo "check_format: all ${#files[@]} files formatted"
