#!/usr/bin/env bash
# Run the floor, the peers and actormesh one after another and write RESULTS.md.
#
#   bash bench/run.sh                  # set up (or reuse) the venvs, full comparison, 3 rounds
#   SKIP_SETUP=1 bash bench/run.sh     # reuse bench/.venvs as they are
#   QUICK=1 bash bench/run.sh          # smoke run: ~10x fewer iterations, 1 round
#
# Other knobs: ROUNDS=n, SYSTEMS="limits monarch ray ray_zc ipp actormesh paired buffers
# allreduce kernel tensor" (any subset, in that order; the last five are actormesh's own scripts
# with their floors inside: call_one and call to 8 interleaved with raw pyzmq, TensorBuffer's
# socket path vs raw pyzmq, gloo all-reduce vs torchrun, %%mesh vs ipyparallel's %%px,
# distributed tensors driven from the controller vs the same work SPMD), LIMIT=590 (seconds per benchmark process), OUT=dir (default
# bench/out/<UTC time>[-quick]).  Never run two benchmarks at once: the machine has 2 cores.
#
# Every run writes $OUT/<system>_run<k>.json, $OUT/logs/<system>_run<k>.log and
# $OUT/RESULTS.md.  A full run of every system also copies that report to bench/RESULTS.md;
# a QUICK run or a subset never overwrites it.  What is written by hand (separate benchmarks,
# before/after passes) goes into a bench/RESULTS-<topic>.md file: every report appends those.
set -uo pipefail
BENCH=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$BENCH/.." && pwd)
export VENV_ROOT=${VENV_ROOT:-$BENCH/.venvs}
ALL_SYSTEMS="limits monarch ray ray_zc ipp actormesh paired buffers allreduce kernel tensor"
SYSTEMS=${SYSTEMS:-$ALL_SYSTEMS}
QUICK=${QUICK:-0}
if [ "$QUICK" = 1 ]; then
  export BENCH_QUICK=1
  ROUNDS=${ROUNDS:-1}
  suffix=-quick
else
  unset BENCH_QUICK
  ROUNDS=${ROUNDS:-3}
  suffix=
fi
LIMIT=${LIMIT:-590}
OUT=${OUT:-$BENCH/out/$(date -u +%Y%m%d-%H%M%S)$suffix}
mkdir -p "$OUT/logs"

venv_of() {
  case $1 in ray_zc) echo ray ;; paired | buffers | allreduce | kernel | tensor) echo actormesh ;; *) echo "$1" ;; esac
}
script_of() {
  case $1 in
    actormesh | paired | buffers | allreduce | kernel | tensor) echo "$BENCH/bench_$1.py" ;;
    ray_zc) echo "$BENCH/peers/bench_ray.py" ;;
    *) echo "$BENCH/peers/bench_$1.py" ;;
  esac
}

{
  echo "cd $REPO && SKIP_SETUP=${SKIP_SETUP:-0} QUICK=$QUICK ROUNDS=$ROUNDS" \
       "SYSTEMS=\"$SYSTEMS\" LIMIT=$LIMIT bash bench/run.sh"
} > "$OUT/command.txt"
git -C "$REPO" rev-parse HEAD > "$OUT/git.txt" 2>/dev/null || echo "(no commit yet)" > "$OUT/git.txt"
echo "uncommitted changes: $(git -C "$REPO" status --porcelain 2>/dev/null | wc -l) paths" \
  >> "$OUT/git.txt"

if [ "${SKIP_SETUP:-0}" != 1 ]; then
  venvs=$(for s in $SYSTEMS; do venv_of "$s"; done | sort -u | tr '\n' ' ')
  # shellcheck disable=SC2086
  bash "$BENCH/setup_venvs.sh" $venvs || { echo "venv setup failed" >&2; exit 1; }
fi
for s in $SYSTEMS; do
  v=$(venv_of "$s")
  cp "$VENV_ROOT/$v.freeze.txt" "$OUT/$v.freeze.txt" 2>/dev/null || true
done

run_one() {  # system round
  local sys=$1 k=$2 py pgid rc t0 load0
  py="$VENV_ROOT/$(venv_of "$sys")/bin/python"
  if [ ! -x "$py" ]; then
    echo "   $sys: no venv at $py (run without SKIP_SETUP=1)"
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$sys" "$k" "novenv" 0 "-" "-" >> "$OUT/status.tsv"
    return
  fi
  local -a envs=()
  if [ "$sys" = ray_zc ]; then envs=(RAY_ENABLE_ZERO_COPY_TORCH_TENSORS=1); fi
  load0=$(cut -d' ' -f1-3 /proc/loadavg)
  t0=$(date +%s)
  echo "== $(date -u +%T) $sys round $k (load $load0)"
  # own session and process group, so whatever the benchmark leaves behind can be ended by id
  env "${envs[@]}" BENCH_OUT="$OUT/${sys}_run$k.json" \
    setsid --wait timeout -k 20 "$LIMIT" "$py" "$(script_of "$sys")" \
    > "$OUT/logs/${sys}_run$k.log" 2>&1 &
  pgid=$!
  CUR_PGID=$pgid
  wait "$pgid"
  rc=$?
  for _ in 1 2 3 4 5; do  # give exiting helpers (resource trackers, nannies) a moment
    kill -0 -- "-$pgid" 2>/dev/null || break
    sleep 1
  done
  if kill -0 -- "-$pgid" 2>/dev/null; then
    echo "   $sys left processes in its group $pgid; ending them:"
    ps -o pid=,etimes=,args= -g "$pgid" | cut -c1-160 | sed 's/^/     /' \
      | tee -a "$OUT/logs/${sys}_run$k.log"
    kill -TERM -- "-$pgid" 2>/dev/null; sleep 3; kill -KILL -- "-$pgid" 2>/dev/null
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$sys" "$k" "$rc" "$(( $(date +%s) - t0 ))" "$load0" \
    "$(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/status.tsv"
  echo "   rc=$rc in $(( $(date +%s) - t0 )) s ($OUT/logs/${sys}_run$k.log)"
}

CUR_PGID=
on_signal() {  # Ctrl-C / TERM: end the running benchmark's process group too
  [ -n "$CUR_PGID" ] && kill -TERM -- "-$CUR_PGID" 2>/dev/null
  exit 130
}
trap on_signal INT TERM

printf 'system\tround\trc\tseconds\tload_start\tload_end\n' > "$OUT/status.tsv"
for k in $(seq 1 "$ROUNDS"); do
  for s in $ALL_SYSTEMS; do
    case " $SYSTEMS " in *" $s "*) run_one "$s" "$k" ;; esac
  done
done

python3 "$BENCH/report.py" "$OUT" > "$OUT/RESULTS.md"
echo "report: $OUT/RESULTS.md"
if [ "$QUICK" != 1 ] && [ "$SYSTEMS" = "$ALL_SYSTEMS" ]; then
  cp "$OUT/RESULTS.md" "$BENCH/RESULTS.md"
  echo "copied to $BENCH/RESULTS.md"
fi
