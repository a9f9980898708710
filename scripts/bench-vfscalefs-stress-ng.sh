#!/usr/bin/env bash
# stress-ng's lock stressors through vfscalefs with its clients' locks held on the source
# too (-o source_locks=mirror, the default) against held by the server alone (off): two
# servers of one tmpfs source, alternated run by run (which goes first alternates too),
# and the source itself as the reference without FUSE.
#
#   scripts/bench-vfscalefs-stress-ng.sh [SECONDS] [RUNS] [WORKERS] [STRESSORS]
#       (root; stress-ng; defaults 5 3 2 flock,fcntl,lockf,lockofd,locka)
#
# Each measurement is `stress-ng --STRESSOR WORKERS --timeout SECONDS --temp-path DIR`;
# its rate is stress-ng's bogo-ops per second of real time. Prints, per run and
# stressor, the three rates and mirror ÷ off, then per stressor the mean of the paired
# ratios with what an exact mirror can reach (the serial model below). Results:
# vfscale-report/vfscalefs-stress-ng/.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-5}
RUNS=${2:-3}
WORKERS=${3:-2}
STRESSORS=${4:-flock,fcntl,lockf,lockofd,locka}
OUT=vfscale-report/vfscalefs-stress-ng
if [ "$(id -u)" != 0 ]; then echo "SKIP: needs root (mounts)"; exit 0; fi
command -v stress-ng >/dev/null || { echo "SKIP: stress-ng is not installed"; exit 0; }
# BIN: where the binaries are (default: build them into target/release).
. scripts/lib-vfscalefs.sh
use_binaries vfscalefs vfscale-lab
mkdir -p "$OUT"
: >"$OUT/ratios.txt"
BASE=$(mktemp -d /dev/shm/vfscalefs-stress-ng.XXXXXX)
mkdir "$BASE/src" "$BASE/mirror" "$BASE/off"
cleanup() {
  for m in mirror off; do
    umount "$BASE/$m" 2>/dev/null || umount -l "$BASE/$m" 2>/dev/null || true
  done
  sleep 0.5
  rm -rf "$BASE"
}
trap cleanup EXIT

# One server per setting, both of $BASE/src.
for m in mirror off; do
  "$BIN/vfscalefs" "$BASE/src" "$BASE/$m" -o "source_locks=$m" 2>"$BASE/$m.log" &
  wait_for_server "$BASE/$m.log"
done
echo "vfscalefs source_locks=mirror and =off on $BASE/src; $(nproc) CPUs, Linux $(uname -r)," \
  "commit $(git rev-parse --short HEAD), $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
wakeup_control
echo "stress-ng --STRESSOR $WORKERS --timeout $SECONDS_EACH --temp-path DIR; $RUNS runs"

# The bogo-ops per second (real time) of one stress-ng run on directory $2.
rate() {
  local yaml="$OUT/$1-$3-$4.yaml"
  stress-ng "--$1" "$WORKERS" --timeout "$SECONDS_EACH" --temp-path "$2" \
    --metrics-brief --yaml "$yaml" >"$OUT/$1-$3-$4.log" 2>&1
  awk '/bogo-ops-per-second-real-time:/ { print $2; exit }' "$yaml"
}

for r in $(seq "$RUNS"); do
  for s in ${STRESSORS//,/ }; do
    # Alternate which setting goes first; the source alone last.
    if [ $((r % 2)) = 1 ]; then order="mirror off"; else order="off mirror"; fi
    declare -A got=()
    for t in $order; do got[$t]=$(rate "$s" "$BASE/$t" "$t" "$r"); done
    got[src]=$(rate "$s" "$BASE/src" src "$r")
    awk -v r="$r" -v s="$s" -v m="${got[mirror]}" -v o="${got[off]}" -v t="${got[src]}" \
      'BEGIN { printf "run %s %-8s mirror %10.0f/s  off %10.0f/s  ratio %.3f   (source, tmpfs: %10.0f/s)\n", r, s, m, o, m / o, t }' \
      | tee -a "$OUT/ratios.txt"
  done
done
# The serial model of an exact mirror: it makes the source's own lock calls (one per
# lock change, as the source alone does); if they add to the mount's time per
# operation, mirror ÷ off is 1 / (1 + off ÷ source). Linux walks a file's lock list on each
# call, so a stressor that holds many locks (lockf) makes them dear.
awk '{ k = $3; sum[k] += $9; n[k]++; v[k] = v[k] (n[k] > 1 ? ", " : "") $9; off[k] += $7; src[k] += $12 }
     END { for (k in sum) printf "mean of paired ratios, %-8s %.3f (%s); serial model 1/(1 + off/source) %s\n",
             k, sum[k] / n[k], v[k], (src[k] > 0 ? sprintf("%.3f", 1 / (1 + off[k] / src[k])) : "-") }' \
  "$OUT/ratios.txt" | sort
