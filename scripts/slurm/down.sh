#!/usr/bin/env bash
# Stop what scripts/slurm/up.sh DIR started, by pid file: slurmds, slurmctld, munged
# (SIGTERM, then SIGKILL after 3 s: slurmctld can take ~9 s to exit otherwise).
set -uo pipefail
D=$1
for f in "$D"/slurmd.*.pid "$D/slurmctld.pid" "$D/munge/munged.pid"; do
  [ -f "$f" ] || continue
  p=$(cat "$f")
  kill "$p" 2>/dev/null || true
  for _ in $(seq 30); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$p" 2>/dev/null || true
  rm -f "$f"
done
exit 0
