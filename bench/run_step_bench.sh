#!/usr/bin/env bash
# The training-step benchmark matrix (bench/README.md): for each model x optimizer, in one
# go and in one environment, the step time of
#   plain2  plain LibTorch, one process, 2 threads           (step_bench --mode plain)
#   plain1  plain LibTorch, one process, 1 thread
#   indep   two plain1 processes at once, unrelated (no communication): what 2 ranks would
#           reach if distributing cost nothing but the shared machine (each copy's step
#           time counts as one run of the cell)
#   w1      ours at world 1, 2 threads                       (step_bench --mode accel, alone)
#   <comm>  ours, DDP at world 2, 1 thread per rank, per communicator in --comms:
#           gloo, shm and others through `accel launch --num_processes 2`, mpi through
#           `accel launch --use_mpi` (one mpirun -np 2); zero1_shm: ZeRO stage 1 over shm
#           instead of DDP (each rank steps its shard of the optimizer state)
#   pt_ddp  PyTorch DistributedDataParallel, gloo, world 2, 1 thread per rank, started by
#           torch's own launcher (python3 -m torch.distributed.run --nproc_per_node 2)
#   pt1     PyTorch, one process, 2 threads (no DDP)
# then tables of ms/step (the median step, and the fastest step: the latter moves less with
# whatever else the machine runs) and the ratios, of the statistic --stat chooses:
#   w1/plain2         our overhead at world 1 (target <= 1.03)
#   <comm>/pt_ddp     our DDP step time over PyTorch DDP's (below 1 = faster)
#   thr_<comm>        world-2 throughput (2 x batch per step) over plain2's (1 x batch per
#                     step), i.e. 2 x plain2 / <comm>: above 1 = distributing paid off
#   thr_pt            the same for PyTorch: 2 x pt1 / pt_ddp
#   thr_indep         the same for indep, 2 x plain2 / indep: the ceiling of thr_<comm> on
#                     this machine; what separates them is the all-reduce and the ranks
#                     stepping in lockstep (bench/journal/2026-12-03, "DDP on one machine: the ceiling")
#
#   bench/run_step_bench.sh                       # everything (about 12 minutes on 2 cores)
#   bench/run_step_bench.sh --quick               # a smoke run: few steps, any numbers
#   bench/run_step_bench.sh --models mlp2m --optimizers sgd --comms gloo,mpi,shm
#
# Environment, the same for every run: OpenBLAS's OpenMP build first on the library path
# (LibTorch and PyTorch both call libblas.so.3 / libopenblas.so.0),
# GLIBC_TUNABLES as `accel launch` sets it for CPU workers (malloc on transparent huge pages,
# big blocks reused: far fewer page faults; PyTorch gets the same), OMP_NUM_THREADS equal to the threads of the run. Each run's full output goes to
# the log (--log, default build/step_bench.log). Exit status 1 when a run printed no result.
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$repo/build"
models="cnn,mlp2m,mlp25m"
optimizers="sgd,adam"
comms="gloo,mpi,shm"
pytorch=1
quick=0
steps=""
warmup=""
log=""
stat=median
repeat=1
python=/usr/bin/python3  # Debian's python3-torch lives in the system Python
plot=""

usage() {
  sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
  cat <<EOF
flags:
  --models LIST      cnn,mlp2m,mlp25m        (default all)
  --optimizers LIST  sgd,adam                (default both)
  --comms LIST       our world-2 communicators, any name create_communicator knows,
                     and zero1_shm (ZeRO-1 over shm)         (default gloo,mpi,shm)
  --no_pytorch       skip the PyTorch columns
  --quick            5 steps after 2 warm-up steps (a smoke run)
  --steps N, --warmup N   timed and warm-up steps of every run (default per model:
                     cnn 100/10, mlp2m 200/20, mlp25m 40/5)
  --build DIR        the build directory (default build/): DIR/bin/step_bench, DIR/bin/accel
  --log FILE         full output of every run (default DIR/step_bench.log)
  --stat S           median (default) or min: the step time the ratios use
  --repeat N         run each row's set of runs N times, interleaved (default 1); every
                     cell is then the median over the N runs (less drift between columns)
  --python PATH      the Python with torch (default /usr/bin/python3)
  --plot FILE        the median table as bars, a PNG (default DIR/step_bench.png, beside
                     its table FILE without .png + .txt; needs python3-matplotlib)
EOF
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --models) models=$2; shift 2 ;;
    --optimizers) optimizers=$2; shift 2 ;;
    --comms) comms=$2; shift 2 ;;
    --no_pytorch) pytorch=0; shift ;;
    --quick) quick=1; shift ;;
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --log) log=$2; shift 2 ;;
    --stat) stat=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --plot) plot=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run_step_bench: unknown flag '$1' (--help)" >&2; exit 2 ;;
  esac
done
log=${log:-$build/step_bench.log}
plot=${plot:-$build/step_bench.png}
[[ $stat == median || $stat == min ]] || { echo "run_step_bench: --stat median|min" >&2; exit 2; }
step_bench="$build/bin/step_bench"
accel="$build/bin/accel"
for exe in "$step_bench" "$accel"; do
  if [[ ! -x "$exe" ]]; then
    echo "run_step_bench: $exe not built (cmake --build $build --target step_bench accel)" >&2
    exit 2
  fi
done
IFS=, read -ra model_list <<<"$models"
IFS=, read -ra optimizer_list <<<"$optimizers"
IFS=, read -ra comm_list <<<"$comms"

# ---- the one environment
# What `accel launch` gives its CPU workers, for the processes it does not start.
GLIBC_TUNABLES=$("$repo/bench/worker_tunables.sh" "$accel") || exit 2
export GLIBC_TUNABLES
openblas_dir=/usr/lib/x86_64-linux-gnu/openblas-openmp
if [[ -e "$openblas_dir/libblas.so.3" ]]; then
  export LD_LIBRARY_PATH="$openblas_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  echo "run_step_bench: warning: $openblas_dir missing (Debian libopenblas0-openmp);" \
    "the BLAS is whatever libblas.so.3 is" >&2
fi
# No user config file or ACCEL_* settings: the launcher's defaults and our flags only.
for v in $(compgen -e | grep '^ACCEL_'); do unset "$v"; done
XDG_CONFIG_HOME=$(mktemp -d)
export XDG_CONFIG_HOME
trap 'rm -rf "$XDG_CONFIG_HOME"' EXIT

if [[ $pytorch == 1 ]] && ! "$python" -c 'import torch.distributed.run' 2>/dev/null; then
  echo "run_step_bench: $python has no torch.distributed.run (scripts/setup.sh --bench installs" \
    "Debian's python3-torch); PyTorch columns skipped" >&2
  pytorch=0
fi
mpirun_found=1
command -v mpirun >/dev/null || mpirun_found=0

free_port() {
  "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null ||
    echo $((20000 + RANDOM % 20000))
}

{
  echo "==== run_step_bench $(date -u '+%F %T UTC') on $(hostname): $(nproc) cores; load: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "GLIBC_TUNABLES=$GLIBC_TUNABLES LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  env | grep -E '^(OMP_|GOMP_|KMP_|OPENBLAS_|MKL_)' | sort
} >>"$log"
# Settings from the caller's environment that change every run's speed, said up front: e.g.
# OMP_WAIT_POLICY=passive keeps 2-thread runs from collapsing when other processes load the
# machine (OpenMP threads spin-wait for each other by default).
inherited=$(env | grep -E '^(OMP_|GOMP_|KMP_|OPENBLAS_|MKL_)' | grep -v '^OMP_NUM_THREADS=' | sort | tr '\n' ' ')
[[ -n $inherited ]] && echo "environment kept for every run: $inherited"

declare -A median_ms min_ms samples_per_s
failed=0

# run KEY THREADS COMMAND...: runs it with OMP_NUM_THREADS=THREADS, logs everything, and
# adds the "step_bench:" line's median_ms, min_ms and samples_per_s to KEY's lists (one
# entry per repetition).
run() {
  local key=$1 threads=$2
  shift 2
  echo "---- $key: OMP_NUM_THREADS=$threads $*" >>"$log"
  local out
  out=$(OMP_NUM_THREADS=$threads timeout 1200 "$@" 2>&1)
  record "$key" $? "$out"
}

# run_pair KEY THREADS COMMAND...: two copies of COMMAND at once, as run does one; each
# copy's result is one entry of KEY.
run_pair() {
  local key=$1 threads=$2
  shift 2
  echo "---- $key: two at once, each OMP_NUM_THREADS=$threads $*" >>"$log"
  local first rc_first out_second rc_second
  first=$(mktemp)
  OMP_NUM_THREADS=$threads timeout 1200 "$@" >"$first" 2>&1 &
  local pid=$!
  out_second=$(OMP_NUM_THREADS=$threads timeout 1200 "$@" 2>&1)
  rc_second=$?
  wait "$pid"
  rc_first=$?
  record "$key" "$rc_first" "$(cat "$first")"
  record "$key" "$rc_second" "$out_second"
  rm -f "$first"
}

# record KEY EXIT_STATUS OUTPUT: logs OUTPUT and adds its result line to KEY's lists.
record() {
  local key=$1 rc=$2 out=$3
  printf '%s\n' "$out" >>"$log"
  local line
  line=$(grep -o 'step_bench: .*' <<<"$out" | tail -1)
  if [[ $rc -ne 0 || -z "$line" ]]; then
    echo "run_step_bench: $key failed (exit $rc); see $log" >&2
    failed=1
    return
  fi
  # The ZeRO-1 column is only what it says when the strategy was ZeRO-1 (step_bench names it).
  if [[ $key == */zero1_shm && $line != *" strategy=zero1 "* ]]; then
    echo "run_step_bench: $key ran under $(grep -o 'strategy=[^ ]*' <<<"$line"), not ZeRO-1; see $log" >&2
    failed=1
    return
  fi
  local med min sps
  med=$(grep -o 'median_ms=[^ ]*' <<<"$line" | cut -d= -f2)
  min=$(grep -o 'min_ms=[^ ]*' <<<"$line" | cut -d= -f2)
  sps=$(grep -o 'samples_per_s=[^ ]*' <<<"$line" | cut -d= -f2)
  median_ms[$key]+=" $med"
  min_ms[$key]+=" $min"
  samples_per_s[$key]+=" $sps"
  printf '  %-20s median %9s ms/step, min %9s, %9s samples/s (mean)\n' "$key" "$med" "$min" "$sps"
}

columns=(plain2 plain1 indep w1)
for c in "${comm_list[@]}"; do columns+=("$c"); done
[[ $pytorch == 1 ]] && columns+=(pt_ddp pt1)

for model in "${model_list[@]}"; do
  case "$model" in
    cnn) s=100 w=10 ;;
    mlp2m) s=200 w=20 ;;
    mlp25m) s=40 w=5 ;;
    *) echo "run_step_bench: unknown model '$model'" >&2; exit 2 ;;
  esac
  [[ $quick == 1 ]] && s=5 w=2
  s=${steps:-$s}
  w=${warmup:-$w}
  for opt in "${optimizer_list[@]}"; do
    row="$model/$opt"
    echo "$row ($s steps after $w warm-up, batch 64 per process; load $(cut -d' ' -f1 /proc/loadavg))"
    args=(--model "$model" --optimizer "$opt" --steps "$s" --warmup "$w")
    for ((r = 1; r <= repeat; r++)); do
    run "$row/plain2" 2 "$step_bench" "${args[@]}" --mode plain --threads 2
    run "$row/plain1" 1 "$step_bench" "${args[@]}" --mode plain --threads 1
    run_pair "$row/indep" 1 "$step_bench" "${args[@]}" --mode plain --threads 1
    run "$row/w1" 2 "$step_bench" "${args[@]}" --mode accel --threads 2
    for c in "${comm_list[@]}"; do
      if [[ $c == mpi ]]; then
        if [[ $mpirun_found == 0 ]]; then
          echo "run_step_bench: no mpirun; $row/mpi skipped" >&2
          continue
        fi
        launch=("$accel" launch -q --use_mpi --num_processes 2 --main_process_port 0 --comm_backend mpi)
      elif [[ $c =~ ^(gloo|shm|auto|hierarchical)$ ]]; then
        launch=("$accel" launch -q --num_processes 2 --main_process_port 0 --comm_backend "$c")
      elif [[ $c == zero1_shm ]]; then
        launch=("$accel" launch -q --num_processes 2 --main_process_port 0 --comm_backend shm
          --use_zero --zero_stage 1)
      else
        # A communicator the config schema may not list yet: chosen by the variable the
        # library reads (a user's own ACCEL_COMM_BACKEND wins over the launcher's choice).
        launch=(env ACCEL_COMM_BACKEND="$c" "$accel" launch -q --num_processes 2 --main_process_port 0)
      fi
      run "$row/$c" 1 "${launch[@]}" "$step_bench" "${args[@]}" --mode accel --threads 1
    done
    if [[ $pytorch == 1 ]]; then
      # --redirects 1 --tee 1: torch 1.13's launcher fails on Python 3.11 with its default
      # --redirects 0 (Std.from_str("0") returns None there); this sends the workers' stdout
      # to its log files and to the console, the same output.
      run "$row/pt_ddp" 1 "$python" -m torch.distributed.run --nproc_per_node 2 \
        --master_port "$(free_port)" --redirects 1 --tee 1 \
        "$repo/bench/pytorch_ddp_step.py" "${args[@]}" --threads 1
      run "$row/pt1" 2 "$python" "$repo/bench/pytorch_ddp_step.py" "${args[@]}" --threads 2
    fi
    done
  done
done

# ---- the tables
ratio() {  # ratio A B [SCALE]: SCALE x A/B to 2 decimals, or - when either is missing
  if [[ -n "${1:-}" && -n "${2:-}" ]]; then
    awk -v a="$1" -v b="$2" -v k="${3:-1}" 'BEGIN { printf "%.2f", k * a / b }'
  else
    echo -
  fi
}
# t STAT KEY: that cell's step time in ms (the median over the repetitions), or nothing
t() {
  local list
  if [[ $1 == min ]]; then list=${min_ms[$2]:-}; else list=${median_ms[$2]:-}; fi
  [[ -z ${list// /} ]] && return
  tr ' ' '\n' <<<"$list" | grep . | sort -g |
    awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'
}

ms_table() {  # ms_table STAT
  local header line v
  header=$(printf '%-12s' model/opt)
  for col in "${columns[@]}"; do header+=$(printf ' %8s' "$col"); done
  echo "$header"
  for model in "${model_list[@]}"; do
    for opt in "${optimizer_list[@]}"; do
      line=$(printf '%-12s' "$model/$opt")
      for col in "${columns[@]}"; do
        v=$(t "$1" "$model/$opt/$col")
        [[ -n $v ]] && v=$(printf '%.1f' "$v") || v=-
        line+=$(printf ' %8s' "$v")
      done
      echo "$line"
    done
  done
}

echo
echo "ms per step, median (batch 64 per process; world-2 columns: 1 thread per rank)"
ms_table median
echo
echo "ms per step, fastest step"
ms_table min
echo
echo "ratios of the $stat step (time: w1/plain2, <comm>/pt_ddp; throughput: thr_X = 2 x one process's step / X's step; thr_indep: two unrelated processes, the ceiling)"
header=$(printf '%-12s %9s' model/opt w1/plain2)
for c in "${comm_list[@]}"; do header+=$(printf ' %11s' "$c/pt_ddp"); done
for c in "${comm_list[@]}"; do header+=$(printf ' %9s' "thr_$c"); done
[[ $pytorch == 1 ]] && header+=$(printf ' %9s' thr_pt)
header+=$(printf ' %9s' thr_indep)
echo "$header"
for model in "${model_list[@]}"; do
  for opt in "${optimizer_list[@]}"; do
    r="$model/$opt"
    line=$(printf '%-12s %9s' "$r" "$(ratio "$(t $stat "$r/w1")" "$(t $stat "$r/plain2")")")
    for c in "${comm_list[@]}"; do
      line+=$(printf ' %11s' "$(ratio "$(t $stat "$r/$c")" "$(t $stat "$r/pt_ddp")")")
    done
    for c in "${comm_list[@]}"; do
      line+=$(printf ' %9s' "$(ratio "$(t $stat "$r/plain2")" "$(t $stat "$r/$c")" 2)")
    done
    [[ $pytorch == 1 ]] &&
      line+=$(printf ' %9s' "$(ratio "$(t $stat "$r/pt1")" "$(t $stat "$r/pt_ddp")" 2)")
    line+=$(printf ' %9s' "$(ratio "$(t $stat "$r/plain2")" "$(t $stat "$r/indep")" 2)")
    echo "$line"
  done
done
echo
echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg); full output: $log"
ms_table median >"${plot%.png}.txt"
/usr/bin/python3 "$repo/bench/plot_bench.py" step "${plot%.png}.txt" "$plot"
exit $failed
