#!/usr/bin/env bash
# The LibTorch-based tests under every CPU kernel choice this machine can execute: each
# OpenBLAS kernel family (OPENBLAS_CORETYPE: Prescott ... Cooperlake) crossed with each ATen
# dispatch level (ATEN_CPU_CAPABILITY: default, avx2, avx512). LibTorch's numbers depend on
# both, and a machine only ever runs the one it detects, so an equivalence tolerance that holds
# here may not hold on another CPU (issue 13: Cooperlake kernels drift 4e-5 where Haswell ones
# drift 3e-7). Prints one row per variant and test: pass/fail, how many "max |diff|" figures
# the test printed, the largest, and the largest figure / limit where the test names its limit;
# exits 1 if any test failed.
#
# A developer tool, not part of ctest: 21 variants x the tests took 33 minutes on 2 shared cores.
# Run it after changing a tolerance or an arithmetic path, on a built tree:
#   scripts/cpu_variants.sh [--build DIR] [--all] [--coretypes "Haswell Zen"] [--aten "avx2"]
#                           [--tests "data_parallel_test ..."] [--logs DIR]
# --all runs every test case of each binary; by default only the equivalence cases (the ones
# that compare ranks, replicas, strategies or a resumed run with a reference).
# Needs the print_torch_cpu probe (built with the tests): it says which kernels a process got,
# since both variables fall back silently to the detected kernels when the asked one is unknown.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build"
all=0
coretypes="Prescott Nehalem Sandybridge Haswell Zen SkylakeX Cooperlake"
atens="default avx2 avx512"
tests="data_parallel_test torch_accelerator_test merge_weights_test fashion_mnist_test"
logs=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$(cd "$2" && pwd); shift 2 ;;
    --all) all=1; shift ;;
    --coretypes) coretypes=$2; shift 2 ;;
    --aten) atens=$2; shift 2 ;;
    --tests) tests=$2; shift 2 ;;
    --logs) logs=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "cpu_variants.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
bin="$build/bin"
probe="$bin/print_torch_cpu"
if [ ! -x "$probe" ]; then
  echo "cpu_variants.sh: $probe not built (cmake --build $build --target print_torch_cpu)" >&2
  exit 2
fi
for t in $tests; do
  if [ ! -x "$bin/$t" ]; then
    echo "cpu_variants.sh: $bin/$t not built (cmake --build $build --target $t)" >&2
    exit 2
  fi
done
[ -n "$logs" ] || logs=$(mktemp -d /tmp/cpu_variants.XXXXXX)
mkdir -p "$logs"

# The equivalence cases of each binary (doctest -tc filters); --all runs everything.
filter_for() {
  [ "$all" = 1 ] && return
  case "$1" in
    data_parallel_test) echo "-tc=*equals one replica*" ;;
    torch_accelerator_test)
      echo "-tc=DDP over*equals one process*,ZeRO-1 and ZeRO-2*,a LibTorch ZeRO-2 checkpoint*,model, optimizer, scheduler and RNG resume bitwise*" ;;
    merge_weights_test) echo "-tc=merge-weights of a*" ;;
  esac
}

# What the CPU can execute: the instruction sets each kernel family needs (/proc/cpuinfo).
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { for f in "$@"; do [[ "$flags" == *" $f "* ]] || return 1; done; }
can_run_core() {
  case "$1" in
    Prescott) has pni ;;
    Nehalem) has pni ssse3 sse4_1 sse4_2 ;;
    Sandybridge) has avx ;;
    Haswell|Zen) has avx avx2 fma ;;
    SkylakeX) has avx2 fma avx512f avx512cd avx512bw avx512dq avx512vl ;;
    Cooperlake) has avx2 fma avx512f avx512cd avx512bw avx512dq avx512vl avx512_bf16 ;;
    *) return 1 ;;
  esac
}
can_run_aten() {
  case "$1" in
    default) return 0 ;;
    avx2) has avx2 fma ;;
    avx512) has avx512f avx512bw avx512dq avx512vl ;;
    *) return 1 ;;
  esac
}
aten_name() {  # what at::show_config() says for each ATEN_CPU_CAPABILITY value
  case "$1" in default) echo "NO AVX" ;; avx2) echo AVX2 ;; avx512) echo AVX512 ;; esac
}

failed=0
rows=()
row() { rows+=("$(printf '%-24s %-24s %-8s %8s %12s %10s' "$@")"); echo "${rows[-1]}"; }
row variant test result figures "max |diff|" "max d/limit"
for core in $coretypes; do
  for aten in $atens; do
    variant="$core/$aten"
    if ! can_run_core "$core" || ! can_run_aten "$aten"; then
      row "$variant" "-" "skipped" "" "" "(CPU lacks the instructions)"
      continue
    fi
    env_of=(env OPENBLAS_CORETYPE="$core" ATEN_CPU_CAPABILITY="$aten")
    # Really taken? OpenBLAS's own report (OPENBLAS_VERBOSE=2: "Core: X"), and the probe's.
    taken=$("${env_of[@]}" OPENBLAS_VERBOSE=2 "$probe" 2>&1)
    verbose_core=$(sed -n 's/^Core: //p' <<<"$taken" | tail -1)
    probe_core=$(sed -n 's/^openblas: //p' <<<"$taken")
    probe_aten=$(sed -n 's/^aten: //p' <<<"$taken")
    if [ "$verbose_core" != "$core" ] || [ "$probe_core" != "$core" ] ||
       [ "$probe_aten" != "$(aten_name "$aten")" ]; then
      row "$variant" "-" "skipped" "" "" "(got ${verbose_core:-?}/${probe_aten:-?})"
      continue
    fi
    for t in $tests; do
      log="$logs/${core}_${aten}_$t.log"
      filter=$(filter_for "$t")
      "${env_of[@]}" "$bin/$t" ${filter:+"$filter"} >"$log" 2>&1
      rc=$?
      result=pass
      if [ $rc -ne 0 ]; then result=FAIL; failed=1; fi
      # Every "max |...| D" a test or its workers printed, and "(limit L" where it follows.
      figures=$(grep -o 'max |[^|]*| =* *[-0-9.e+]*\( (limit [-0-9.e+]*\)\?' "$log")
      count=$(grep -c . <<<"$figures")
      [ -n "$figures" ] || count=0
      worst=$(sed -n 's/max |[^|]*| =* *\([-0-9.e+]*\).*/\1/p' <<<"$figures" |
              sort -g | tail -1)
      ratio=$(sed -n 's/max |[^|]*| =* *\([-0-9.e+]*\) (limit \([-0-9.e+]*\)/\1 \2/p' <<<"$figures" |
              awk '$2 > 0 { r = $1 / $2; if (r > m) m = r; n++ } END { if (n) printf "%.3g", m }')
      row "$variant" "$t" "$result" "$count" "${worst:--}" "${ratio:--}"
    done
  done
done
echo
echo "logs: $logs"
if [ $failed -ne 0 ]; then
  echo "cpu_variants.sh: some tests failed (FAIL rows; their logs are above)" >&2
  exit 1
fi
