#!/usr/bin/env bash
# Tear down what up.sh PREFIX made: kill every process in its namespaces (by pid, from
# `ip netns pids`), then delete the namespaces (their veth ends, and the peers, go with them).
# Usage: down.sh PREFIX
set -uo pipefail
prefix=$1
for ns in $(ip netns list | awk '{print $1}' | grep "^$prefix-"); do
  for pid in $(ip netns pids "$ns"); do kill -9 "$pid" 2>/dev/null || true; done
  ip netns del "$ns"
done
ip link del "${prefix}r" 2>/dev/null || true
exit 0
