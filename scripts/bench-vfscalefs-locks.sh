#!/usr/bin/env bash
# The herd through vfscalefs with its clients' locks held on the source
# (`-o source_locks=mirror`) against the same server with them held only in the
# server (`-o source_locks=off`): servers of one tmpfs source, the lab's herd on
# each mount, alternated run by run (which goes first alternates too).
#
#   scripts/bench-vfscalefs-locks.sh [RUNS] [COPIES]      (root; jq; defaults 3 1)
#
# Each run is `vfscale bench herd --target kernel --dir MNT --tasks 20,1000
# --mode flock,posix --duration 1 --runs 1` on each mount. With COPIES servers of each
# mode (the order of all of them rotated run by run), a run's ratio is the geometric
# mean of its mirror servers' rates ÷ that of its off servers', and COPIES ≥ 2 adds the
# control: copy 1 ÷ copy 2 of the same mode, which a machine without drift reads as 1.
# Prints, per run and per (mode, tasks), the rates and mirror ÷ off, then the mean,
# geometric mean (± its standard error) and median of the runs' ratios, and the
# control's geometric means, with `uptime` after each run. Results:
# vfscale-report/vfscalefs-locks/.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
COPIES=${2:-1}
OUT=vfscale-report/vfscalefs-locks
if [ "$(id -u)" != 0 ]; then echo "SKIP: needs root (mounts)"; exit 0; fi
command -v jq >/dev/null || { echo "SKIP: jq is not installed"; exit 0; }
# BIN: where the binaries are (default: build them into target/release).
. scripts/lib-vfscalefs.sh
use_binaries vfscalefs vfscale-lab
mkdir -p "$OUT"
BASE=$(mktemp -d /dev/shm/vfscalefs-locks.XXXXXX)
mkdir "$BASE/src"
SERVERS=()
for c in $(seq "$COPIES"); do
  for t in mirror off; do
    SERVERS+=("$t$c")
    mkdir "$BASE/$t$c"
  done
done
cleanup() {
  for t in "${SERVERS[@]}"; do umount "$BASE/$t" 2>/dev/null || umount -l "$BASE/$t" 2>/dev/null || true; done
  sleep 0.5
  rm -rf "$BASE"
}
trap cleanup EXIT
for t in "${SERVERS[@]}"; do
  "$BIN/vfscalefs" "$BASE/src" "$BASE/$t" -o "source_locks=${t%%[0-9]*}" 2>"$BASE/$t.log" &
done
for t in "${SERVERS[@]}"; do
  for _ in $(seq 100); do
    grep -q "inodes by" "$BASE/$t.log" 2>/dev/null && break
    sleep 0.1
  done
  cat "$BASE/$t.log"
done
echo "$(nproc) CPUs, Linux $(uname -r), commit $(git rev-parse --short HEAD), $(date -u +%FT%TZ), $(uptime)"
wakeup_control
: >"$OUT/rates.txt"
N=${#SERVERS[@]}
for r in $(seq "$RUNS"); do
  order=()
  for i in $(seq 0 $((N - 1))); do order+=("${SERVERS[$(((i + r) % N))]}"); done
  for t in "${order[@]}"; do
    "$BIN/vfscale" bench herd --target kernel --dir "$BASE/$t" --tasks 20,1000 --mode flock,posix \
      --duration 1 --runs 1 --json >"$OUT/$t-$r.json"
    jq -r --arg t "${t%%[0-9]*}" --arg c "${t##*[a-z]}" --arg r "$r" \
      '.results[] | "\($r) \($t) \($c) \(.mode) \(.tasks) \(.acquisitions_per_sec.mean)"' \
      "$OUT/$t-$r.json" >>"$OUT/rates.txt"
  done
  echo "run $r (${order[*]}):$(uptime)"
done
# Per run and (mode, tasks): geometric means over the copies of each kind.
awk '{ k = $1 " " $4 " " $5; l[$2 " " k] += log($6); n[$2 " " k]++; v[$2 " " $3 " " k] = $6; ks[k] = 1 }
  END { for (k in ks) { split(k, a, " ");
    m = exp(l["mirror " k] / n["mirror " k]); o = exp(l["off " k] / n["off " k]);
    printf "run %s %-5s %4s mirror %8.0f/s  off %8.0f/s  ratio %.3f", a[1], a[2], a[3], m, o, m / o;
    if (("mirror 2 " k) in v) printf "  control mirror %.3f off %.3f", v["mirror 1 " k] / v["mirror 2 " k], v["off 1 " k] / v["off 2 " k];
    printf "\n" } }' \
  "$OUT/rates.txt" | sort -k3,3 -k4,4n -k2,2n | tee "$OUT/ratios.txt"
sort -k3,3 -k4,4n -k10,10g "$OUT/ratios.txt" | awk '
  { k = $3 " " $4; n[k]++; s[k] += $10; l[k] += log($10); q[k] += log($10) ^ 2; x[k, n[k]] = $10;
    if (NF >= 15) { cm[k] += log($13); co[k] += log($15) } }
  END { for (k in n) { m = n[k] % 2 ? x[k, (n[k] + 1) / 2] : (x[k, n[k] / 2] + x[k, n[k] / 2 + 1]) / 2;
    g = exp(l[k] / n[k]); sd = n[k] > 1 ? sqrt((q[k] - l[k] ^ 2 / n[k]) / (n[k] - 1)) : 0;
    printf "%-10s mirror ÷ off: mean %.3f, geometric mean %.3f ± %.3f, median %.3f (%d runs)", k, s[k] / n[k], g, g * sd / sqrt(n[k]), m, n[k];
    if (k in cm) printf "; control mirror %.3f, off %.3f", exp(cm[k] / n[k]), exp(co[k] / n[k]);
    printf "\n" } }' | sort
