#!/usr/bin/env bash
# Fake hosts for multi-host tests: network namespaces PREFIX-h0..h(N-1) on a bridge that lives in
# its own namespace (PREFIX-sw). Host i is SUBNET.(10+i); this (root) namespace joins the bridge
# as SUBNET.1 through the veth PREFIXr, so a controller here reaches every host. No namespace
# has a default route: nothing leaves them. Needs root (CAP_NET_ADMIN). See down.sh.
# Usage: up.sh PREFIX SUBNET N      e.g. up.sh am4242 10.201.42 3
set -euo pipefail
prefix=$1 subnet=$2 n=$3
ip netns add "$prefix-sw"
ip -n "$prefix-sw" link add br0 type bridge
ip -n "$prefix-sw" link set br0 up
ip -n "$prefix-sw" link set lo up
ip link add "${prefix}r" type veth peer name proot netns "$prefix-sw"
ip -n "$prefix-sw" link set proot master br0
ip -n "$prefix-sw" link set proot up
ip addr add "$subnet.1/24" dev "${prefix}r"
ip link set "${prefix}r" up
for i in $(seq 0 $((n - 1))); do
  ns="$prefix-h$i"
  ip netns add "$ns"
  ip link add eth0 netns "$ns" type veth peer name "p$i" netns "$prefix-sw"
  ip -n "$prefix-sw" link set "p$i" master br0
  ip -n "$prefix-sw" link set "p$i" up
  ip -n "$ns" addr add "$subnet.$((i + 10))/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
done
