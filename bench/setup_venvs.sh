#!/usr/bin/env bash
# Create (or reuse) the benchmark venvs under bench/.venvs/ with pip only.
#
#   bash bench/setup_venvs.sh [limits monarch ray ipp actormesh]   # default: all five
#   FORCE_SETUP=1 bash bench/setup_venvs.sh ray                      # rebuild one from scratch
#
# torch==2.13.0 is always installed FIRST, alone, in every venv (pip then takes the CPU build;
# a bare torch requirement resolved first pulls several GB of CUDA packages), and every later
# pip call runs under a constraint that pins torch, so nothing can swap it for a CUDA build.
# A venv is reused as is when its stamp (requested packages + pyproject.toml for actormesh)
# matches, updated in place when it does not, and rebuilt from scratch with FORCE_SETUP=1.
set -euo pipefail
BENCH=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$BENCH/.." && pwd)
VENV_ROOT=${VENV_ROOT:-$BENCH/.venvs}
TORCH_REQ=${TORCH_REQ:-torch==2.13.0}
PY=${PY:-python3.11}
which=${*:-limits monarch ray ipp actormesh}
mkdir -p "$VENV_ROOT"
CONSTRAINTS="$VENV_ROOT/constraints.txt"
echo "$TORCH_REQ" > "$CONSTRAINTS"

packages() {  # name -> the packages installed after torch
  case $1 in
    limits) echo "numpy pyzmq" ;;
    monarch) echo "torchmonarch==0.7.0 numpy pyzmq" ;;
    ray) echo "ray[default]==2.60.0 numpy pyzmq" ;;
    ipp) echo "ipyparallel==9.2.0 numpy pyzmq" ;;
    actormesh) echo "-e $REPO[notebook] numpy" ;;  # notebook: bench_kernel.py's kernel
    *) return 1 ;;
  esac
}

stamp_of() {  # what a venv was built from; a change triggers a reinstall
  local s
  s="$PY $TORCH_REQ $(packages "$1")"
  if [ "$1" = actormesh ]; then s="$s $(sha256sum "$REPO/pyproject.toml" | cut -c1-16)"; fi
  echo "$s"
}

mk() {
  local name=$1 dir="$VENV_ROOT/$1" log="$VENV_ROOT/$1.pip.log" stamp t0
  local -a pkgs
  read -r -a pkgs <<< "$(packages "$name")" || { echo "unknown venv: $name" >&2; exit 2; }
  stamp=$(stamp_of "$name")
  if [ "${FORCE_SETUP:-0}" != 1 ] && [ -x "$dir/bin/python" ] \
     && [ "$(cat "$dir/.bench-stamp" 2>/dev/null)" = "$stamp" ]; then
    echo "venv $name: reused ($(du -sh "$dir" | cut -f1))"
    return 0
  fi
  t0=$(date +%s)
  : > "$log"
  if [ "${FORCE_SETUP:-0}" = 1 ] || ! "$dir/bin/python" -c 'import sys' 2>/dev/null; then
    rm -rf "$dir"
    "$PY" -m venv "$dir"
    "$dir/bin/pip" install -q --upgrade pip >> "$log" 2>&1 || true
  fi  # else: an older or half-built venv is updated in place (pip skips what is installed)
  # 1) torch alone, first
  if ! "$dir/bin/pip" install "$TORCH_REQ" >> "$log" 2>&1; then
    tail -20 "$log"; echo "venv $name: pip install $TORCH_REQ failed (log: $log)" >&2; exit 1
  fi
  # 2) the rest, with torch pinned
  if ! "$dir/bin/pip" install -c "$CONSTRAINTS" "${pkgs[@]}" >> "$log" 2>&1; then
    grep -v "is ignored: it is neither" "$log" | tail -20
    echo "venv $name: pip install ${pkgs[*]} failed (log: $log)" >&2; exit 1
  fi
  "$dir/bin/pip" freeze > "$VENV_ROOT/$name.freeze.txt"
  if grep -qi '^nvidia-' "$VENV_ROOT/$name.freeze.txt"; then
    echo "venv $name: WARNING: CUDA packages were installed (see $name.freeze.txt)" >&2
  fi
  echo "$stamp" > "$dir/.bench-stamp"
  echo "venv $name: built in $(( $(date +%s) - t0 )) s, $(du -sh "$dir" | cut -f1)," \
       "$("$dir/bin/python" -c 'import torch; print("torch", torch.__version__)')"
}

for w in $which; do mk "$w"; done
