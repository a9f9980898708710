#!/usr/bin/env bash
# The herd through vfscalefs with its clients' locks held on the source
# (`-o source_locks=mirror`) against the same server with them held only in the
# server (`-o source_locks=off`): two servers of one tmpfs source, the lab's herd on
# each mount, alternated run by run (which goes first alternates too).
#
#   scripts/bench-vfscalefs-locks.sh [RUNS]      (root; jq; default 3)
#
# Each run is `vfscale bench herd --target kernel --dir MNT --tasks 20,1000
# --mode flock,posix --duration 1 --runs 1` on each mount. Prints, per run and per
# (mode, tasks), both rates and mirror ÷ off, then the mean, geometric mean and median
# of the paired ratios, with `uptime` after each run. Results:
# vfscale-report/vfscalefs-locks/.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
OUT=vfscale-report/vfscalefs-locks
if [ "$(id -u)" != 0 ]; then echo "SKIP: needs root (mounts)"; exit 0; fi
command -v jq >/dev/null || { echo "SKIP: jq is not installed"; exit 0; }
# BIN: where the binaries are (default: build them into target/release).
. scripts/lib-vfscalefs.sh
use_binaries vfscalefs vfscale-lab
mkdir -p "$OUT"
BASE=$(mktemp -d /dev/shm/vfscalefs-locks.XXXXXX)
mkdir "$BASE/src" "$BASE/mirror" "$BASE/off"
cleanup() {
  for t in mirror off; do umount "$BASE/$t" 2>/dev/null || umount -l "$BASE/$t" 2>/dev/null || true; done
  sleep 0.5
  rm -rf "$BASE"
}
trap cleanup EXIT
for t in mirror off; do
  "$BIN/vfscalefs" "$BASE/src" "$BASE/$t" -o source_locks=$t 2>"$BASE/$t.log" &
done
for _ in $(seq 100); do
  grep -q "inodes by" "$BASE/mirror.log" 2>/dev/null && grep -q "inodes by" "$BASE/off.log" 2>/dev/null && break
  sleep 0.1
done
cat "$BASE/mirror.log" "$BASE/off.log"
echo "$(nproc) CPUs, Linux $(uname -r), commit $(git rev-parse --short HEAD), $(date -u +%FT%TZ), $(uptime)"
: >"$OUT/rates.txt"
for r in $(seq "$RUNS"); do
  if [ $((r % 2)) = 1 ]; then order="mirror off"; else order="off mirror"; fi
  for t in $order; do
    "$BIN/vfscale" bench herd --target kernel --dir "$BASE/$t" --tasks 20,1000 --mode flock,posix \
      --duration 1 --runs 1 --json >"$OUT/$t-$r.json"
    jq -r --arg t "$t" --arg r "$r" \
      '.results[] | "\($r) \($t) \(.mode) \(.tasks) \(.acquisitions_per_sec.mean)"' "$OUT/$t-$r.json" >>"$OUT/rates.txt"
  done
  echo "run $r ($order):$(uptime)"
done
awk '{ k = $1 " " $3 " " $4; v[$2 " " k] = $5; ks[k] = 1 }
  END { for (k in ks) { split(k, a, " ");
    printf "run %s %-5s %4s mirror %8.0f/s  off %8.0f/s  ratio %.3f\n", a[1], a[2], a[3], v["mirror " k], v["off " k], v["mirror " k] / v["off " k] } }' \
  "$OUT/rates.txt" | sort -k3,3 -k4,4n -k2,2n | tee "$OUT/ratios.txt"
sort -k3,3 -k4,4n -k10,10g "$OUT/ratios.txt" | awk '
  { k = $3 " " $4; n[k]++; s[k] += $NF; l[k] += log($NF); x[k, n[k]] = $NF }
  END { for (k in n) { m = n[k] % 2 ? x[k, (n[k] + 1) / 2] : (x[k, n[k] / 2] + x[k, n[k] / 2 + 1]) / 2;
    printf "%-10s mirror ÷ off: mean %.3f, geometric mean %.3f, median %.3f (%d runs)\n", k, s[k] / n[k], exp(l[k] / n[k]), m, n[k] } }' | sort
