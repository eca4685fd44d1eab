#!/usr/bin/env bash
# A real Slurm cluster on fake hosts (after scripts/fakehosts/up.sh PREFIX SUBNET 4):
# slurmctld on h0, one slurmd on each of h1..h3, munged shared by all (one file system).
# Every file lives under DIR; nothing is written to /etc. Needs root and scripts/slurm/install.sh.
# Usage: up.sh PREFIX SUBNET DIR        then: SLURM_CONF=DIR/slurm.conf sbatch ...
set -euo pipefail
prefix=$1 subnet=$2 D=$3
mkdir -p "$D/munge" "$D/state" "$D/log" "$D/spool/h1" "$D/spool/h2" "$D/spool/h3"
chmod 711 "$D/munge"
printf '127.0.0.1 localhost\n' > "$D/hosts"
for i in 0 1 2 3; do echo "$subnet.$((10 + i)) h$i" >> "$D/hosts"; done
cat > "$D/slurm.conf" <<CONF
ClusterName=amtest
SlurmctldHost=h0($subnet.10)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$D/munge/munge.sock
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmdParameters=config_overrides
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=30
NodeName=h[1-3] NodeAddr=$subnet.[11-13] CPUs=4 RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
export SLURM_CONF=$D/slurm.conf
# A full fake host: its network namespace, its own host name and /etc/hosts (slurmctld checks
# its name against SlurmctldHost). nsenter, not `ip netns exec`, which hides /sys/fs/cgroup.
fakehost() {
  local i=$1; shift
  nsenter --net="/var/run/netns/$prefix-h$i" unshare --uts --mount \
    sh -c "hostname h$i && mount --bind $D/hosts /etc/hosts && exec \"\$@\"" sh "$@"
}
[ -f "$D/munge/munge.key" ] || mungekey --create --keyfile="$D/munge/munge.key"
munged --socket="$D/munge/munge.sock" --key-file="$D/munge/munge.key" \
  --pid-file="$D/munge/munged.pid" --log-file="$D/munge/munged.log" --seed-file="$D/munge/munged.seed"
fakehost 0 slurmctld -f "$SLURM_CONF" -i
for i in 1 2 3; do fakehost "$i" slurmd -f "$SLURM_CONF" -N "h$i" 2>&1 | grep -vi pmix || true; done
for _ in $(seq 1 240); do
  if sinfo -h -o '%D %T' 2>/dev/null | grep -q '^3 idle'; then exit 0; fi
  sleep 0.25
done
echo "Slurm nodes did not become idle:" >&2
sinfo -N >&2 || true
exit 1
