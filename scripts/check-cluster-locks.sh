#!/usr/bin/env bash
# The lock corpus replayed across two vfscalefs servers of one cluster: a 3-member etcd
# on free loopback ports (data on /dev/shm), two servers with --cluster over one tmpfs
# source, and `vfscale locks check SCENARIOS --dir A --dir B --one-lock-space`
# (process i of each scenario on mount i mod 2; every scenario judged exactly as in one
# directory, EDEADLK across the servers included).
#
#   scripts/check-cluster-locks.sh [LEASE_TTL]      (root; etcd; default 5)
#
# SCENARIOS: the POSIX and flock scenarios of scenarios/locks (none with an F_OFD_ step:
# FUSE carries OFD locks as POSIX ones, so no FUSE mount, one server's either, gives the
# kernel's OFD results); ALL=1: the whole corpus. Prints the servers' mount lines, then
# the check (exit status: the check's).
set -euo pipefail
cd "$(dirname "$0")/.."
TTL=${1:-5}
if [ "$(id -u)" != 0 ]; then echo "SKIP: needs root (mounts)"; exit 0; fi
ETCD=$(command -v etcd || true)
[ -n "$ETCD" ] || { echo "SKIP: etcd is not installed (Debian: etcd-server)"; exit 0; }
# BIN: where the binaries are (default: build them into target/release).
. scripts/lib-vfscalefs.sh
use_binaries vfscalefs vfscale-lab
"$BIN/vfscalefs" --help | grep -q -- --cluster || { echo "SKIP: $BIN/vfscalefs has no --cluster"; exit 0; }
BASE=$(mktemp -d /dev/shm/cluster-locks.XXXXXX)
mkdir "$BASE/src" "$BASE/a" "$BASE/b"
PIDS=()
cleanup() {
  for m in a b; do umount "$BASE/$m" 2>/dev/null || umount -l "$BASE/$m" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rmdir "$BASE/a" "$BASE/b" 2>/dev/null || true
  rm -rf "$BASE/src" "$BASE/etcd" "$BASE"/*.log
  rmdir "$BASE" 2>/dev/null || true
}
trap cleanup EXIT

# Free loopback ports: ask the kernel for six at once, then let them go.
mapfile -t PORTS < <(python3 -c '
import socket
s = [socket.socket() for _ in range(6)]
for x in s: x.bind(("127.0.0.1", 0))
for x in s: print(x.getsockname()[1])
')
CLUSTER=""
ENDPOINTS=""
for i in 0 1 2; do
  CLUSTER+="${CLUSTER:+,}m$i=http://127.0.0.1:${PORTS[$((2 * i + 1))]}"
  ENDPOINTS+="${ENDPOINTS:+,}http://127.0.0.1:${PORTS[$((2 * i))]}"
done
for i in 0 1 2; do
  c=${PORTS[$((2 * i))]} p=${PORTS[$((2 * i + 1))]}
  "$ETCD" --name "m$i" --data-dir "$BASE/etcd/m$i" \
    --listen-client-urls "http://127.0.0.1:$c" --advertise-client-urls "http://127.0.0.1:$c" \
    --listen-peer-urls "http://127.0.0.1:$p" --initial-advertise-peer-urls "http://127.0.0.1:$p" \
    --initial-cluster "$CLUSTER" --initial-cluster-state new --initial-cluster-token "$(basename "$BASE")" \
    --auto-compaction-mode revision --auto-compaction-retention 10000 >"$BASE/etcd-m$i.log" 2>&1 &
  PIDS+=($!)
done
for i in 0 1 2; do
  for _ in $(seq 200); do
    curl -sf "http://127.0.0.1:${PORTS[$((2 * i))]}/health" | grep -q '"health":"true"' && break
    sleep 0.1
  done
done
for m in a b; do
  "$BIN/vfscalefs" "$BASE/src" "$BASE/$m" --cluster "$ENDPOINTS" --node "$m" --lease-ttl "$TTL" 2>"$BASE/$m.log" &
  PIDS+=($!)
done
wait_for_server "$BASE/a.log"
wait_for_server "$BASE/b.log"
echo "$(nproc) CPUs, Linux $(uname -r), commit $(git rev-parse --short HEAD), $(date -u +%FT%TZ)"
if [ "${ALL:-0}" = 1 ]; then
  SCENARIOS=(scenarios/locks)
else
  mapfile -t SCENARIOS < <(grep -rL --include='*.jsonl' F_OFD_ scenarios/locks | sort)
fi
"$BIN/vfscale" locks check "${SCENARIOS[@]}" --dir "$BASE/a" --dir "$BASE/b" --one-lock-space
