#!/usr/bin/env bash
# vfscalefs on a tree of a million files, its server under `ulimit -n 1024`, against
# bindfs on the same tmpfs source, alternated run by run (the lab's inodes workload on
# each mount, `--target kernel --dir MNT`); then the server's memory per cached inode.
#
#   scripts/bench-vfscalefs-scale.sh [FILES] [RUNS]      (root; bindfs; defaults 1000000 3)
#
# Prints, per run, each mount's create / walk / cold-walk rate and vfscalefs ÷ bindfs,
# then the means of the paired ratios; and (resident memory after a stat walk − after
# mounting) ÷ the inodes the kernel holds. Results: vfscale-report/vfscalefs-scale/.
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=${1:-1000000}
RUNS=${2:-3}
OUT=vfscale-report/vfscalefs-scale
if [ "$(id -u)" != 0 ]; then echo "SKIP: needs root (mounts, drop_caches)"; exit 0; fi
for t in bindfs jq; do
  command -v $t >/dev/null || { echo "SKIP: $t is not installed"; exit 0; }
done
# BIN: where the binaries are (default: build them into target/release).
. scripts/lib-vfscalefs.sh
use_binaries vfscalefs vfscale-lab
mkdir -p "$OUT"
: >"$OUT/ratios.txt"
BASE=$(mktemp -d /dev/shm/vfscalefs-scale.XXXXXX)
mkdir "$BASE/src" "$BASE/vf" "$BASE/bf"
cleanup() {
  umount "$BASE/vf" 2>/dev/null || umount -l "$BASE/vf" 2>/dev/null || true
  umount "$BASE/bf" 2>/dev/null || umount -l "$BASE/bf" 2>/dev/null || true
  sleep 0.5
  rm -rf "$BASE"
}
trap cleanup EXIT

mount_vfscalefs() {
  ( ulimit -n 1024; exec "$BIN/vfscalefs" "$BASE/src" "$BASE/vf" ) \
    2>"$BASE/vf.log" &
  wait_for_server "$BASE/vf.log"
}
mount_vfscalefs
bindfs "$BASE/src" "$BASE/bf"
echo "vfscalefs and bindfs on $BASE/src; $(nproc) CPUs, Linux $(uname -r), commit $(git rev-parse --short HEAD), $(date -u +%FT%TZ)"
wakeup_control

rate() { jq -r --arg m "$2" '.results[] | select(.mode == $m) | .ops_per_sec.mean' "$1"; }
for r in $(seq "$RUNS"); do
  # Alternate which goes first.
  if [ $((r % 2)) = 1 ]; then order="vf bf"; else order="bf vf"; fi
  for t in $order; do
    "$BIN/vfscale" bench inodes --target kernel --dir "$BASE/$t" --tasks 1 --runs 1 \
      --files "$FILES" --mode create,walk,cold-walk --json >"$OUT/$t-$r.json"
  done
  for m in create walk cold-walk; do
    v=$(rate "$OUT/vf-$r.json" $m)
    b=$(rate "$OUT/bf-$r.json" $m)
    awk -v r="$r" -v m="$m" -v v="$v" -v b="$b" \
      'BEGIN { printf "run %s %-9s vfscalefs %8.0f/s  bindfs %8.0f/s  ratio %.3f\n", r, m, v, b, v / b }' \
      | tee -a "$OUT/ratios.txt"
  done
done
awk '{ s[$3] += $NF; n[$3]++ } END { for (m in s) printf "mean of paired ratios, %-9s %.3f (%d runs)\n", m, s[m] / n[m], n[m] }' \
  "$OUT/ratios.txt" | sort

# Memory: a fresh server, FILES files made on the source, one stat of each through the
# mount, and the resident memory it grew by over the inodes the kernel holds.
umount "$BASE/vf"
sleep 0.5
mkdir "$BASE/src/mem"
for d in $(seq 0 $(( (FILES + 9999) / 10000 - 1 ))); do
  mkdir "$BASE/src/mem/d$d"
  (cd "$BASE/src/mem/d$d" && seq -f "f%.0f" 1 10000 | xargs touch)
done
export VFSCALEFS_STATS="$BASE/stats"
mount_vfscalefs
pid=$(pgrep -f "vfscalefs $BASE/src $BASE/vf" | head -1)
sleep 1
rss() { awk '/^VmRSS/ { print $2 }' "/proc/$pid/status"; }
before=$(rss)
find "$BASE/vf/mem" -printf '%i %s\n' | wc -l
after=$(rss)
kill -USR1 "$pid"
sleep 1
line=$(tail -1 "$BASE/stats")
inodes=$(echo "$line" | tr ' ' '\n' | awk -F= '$1 == "inodes" { print $2 }')
echo "$line"
awk -v a="$after" -v b="$before" -v n="$inodes" \
  'BEGIN { printf "server memory: %d kB after mounting, %d kB after the walk: %.0f B per cached inode (%d inodes)\n", b, a, (a - b) * 1024 / n, n }' \
  | tee "$OUT/memory.txt"
