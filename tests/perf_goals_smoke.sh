#!/usr/bin/env bash
# bench/run_perf_goals.sh --quick as a smoke run: it must finish and print every goal's
# verdict (met or not met, with its figure), and goal 1's ratios must be what its rounds
# give. The numbers themselves are not checked.
#   tests/perf_goals_smoke.sh BUILD_DIR GOALS
set -uo pipefail
build=$1
goals=$2
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=$("$repo/bench/run_perf_goals.sh" --build "$build" --quick --goals "$goals" \
  --log "$build/perf_goals_smoke.log" 2>&1)
rc=$?
printf '%s\n' "$out"
[[ $rc -eq 0 ]] || { echo "FAIL: run_perf_goals.sh exited $rc" >&2; exit 1; }
IFS=, read -ra wanted <<<"$goals"
for g in "${wanted[@]}"; do
  case $g in
    1) patterns=('^goal 1 \(world 2\): .*: (met|not met) \(' '^goal 1 \(world 4\): .*: (met|not met) \('
         '^ +\(control: the raw library against itself at world 2, noise alone: [0-9]+ of [0-9]+ ratios'
         '^ +\(control: the raw library against itself at world 4, noise alone: [0-9]+ of [0-9]+ ratios') ;;
    *) patterns=("^goal $g \\(.*\\): (met|not met) \\(") ;;
  esac
  for p in "${patterns[@]}"; do
    grep -Eq "$p" <<<"$out" || { echo "FAIL: no verdict matching /$p/" >&2; exit 1; }
  done
done
echo "every verdict printed"
# Goal 1's ratios are computed from the rounds the log holds, as bench/README says.
if [[ ,$goals, == *,1,* ]]; then
  python3 "$repo/tests/support/check_paired_ratios.py" "$build/perf_goals_smoke.log" ||
    { echo "FAIL: a ratio is not the trimmed mean of its rounds' ratios" >&2; exit 1; }
fi
