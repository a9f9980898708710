#!/usr/bin/env bash
# vfscalefs over io_uring (`-o io_uring`) against the same server over /dev/fuse: two
# servers of one tmpfs source, the lab's workloads on each mount, alternated run by run
# (which goes first alternates too).
#
#   scripts/bench-vfscalefs-uring.sh [RUNS] [FILES]      (root; jq; defaults 3 8000)
#
# Each run is, on each mount:
#   vfscale bench inodes --target kernel --dir MNT --tasks 1,2 --files FILES
#       --mode create,walk,chmod,unlink --runs 1
#   vfscale bench herd --target kernel --dir MNT --tasks 20,1000 --mode flock,posix,ofd
#       --duration 1 --runs 1
#   stress-ng --flock 2 --timeout 5 (where stress-ng is installed)
# Prints, per run and (workload, mode, tasks), both rates and io_uring ÷ /dev/fuse, then
# the geometric mean and median of the paired ratios, and the herd's flatness
# (1000 ÷ 20 tasks) over io_uring. Sets /sys/module/fuse/parameters/enable_uring to Y
# for the run and restores it. Results: vfscale-report/vfscalefs-uring/.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
FILES=${2:-8000}
OUT=vfscale-report/vfscalefs-uring
PARAM=/sys/module/fuse/parameters/enable_uring
if [ "$(id -u)" != 0 ]; then echo "SKIP: needs root (mounts, $PARAM)"; exit 0; fi
command -v jq >/dev/null || { echo "SKIP: jq is not installed"; exit 0; }
[ -w "$PARAM" ] || { echo "SKIP: $PARAM is missing (Linux >= 6.14 with CONFIG_FUSE_IO_URING)"; exit 0; }
# BIN: where the binaries are (default: build them into target/release).
. scripts/lib-vfscalefs.sh
use_binaries vfscalefs vfscale-lab
mkdir -p "$OUT"
BASE=$(mktemp -d /dev/shm/vfscalefs-uring.XXXXXX)
mkdir "$BASE/src" "$BASE/ur" "$BASE/df"
OLD_PARAM=$(cat "$PARAM")
cleanup() {
  for t in ur df; do umount "$BASE/$t" 2>/dev/null || umount -l "$BASE/$t" 2>/dev/null || true; done
  sleep 0.5
  rm -rf "$BASE"
  echo "$OLD_PARAM" >"$PARAM"
}
trap cleanup EXIT
echo Y >"$PARAM"

"$BIN/vfscalefs" "$BASE/src" "$BASE/ur" -o io_uring 2>"$BASE/ur.log" &
UR_PID=$!
wait_for_server "$BASE/ur.log"
"$BIN/vfscalefs" "$BASE/src" "$BASE/df" 2>"$BASE/df.log" &
wait_for_server "$BASE/df.log"
# The rings' threads exist only when the kernel took the io_uring transport.
if ! grep -q '^fuser-uring' /proc/"$UR_PID"/task/*/comm; then
  echo "FAIL: the -o io_uring server serves /dev/fuse (see its line above)"
  exit 1
fi
echo "$(nproc) CPUs, Linux $(uname -r), commit $(git rev-parse --short HEAD), $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
wakeup_control

: >"$OUT/rates.txt"
for r in $(seq "$RUNS"); do
  if [ $((r % 2)) = 1 ]; then order="ur df"; else order="df ur"; fi
  for t in $order; do
    "$BIN/vfscale" bench inodes --target kernel --dir "$BASE/$t" --tasks 1,2 --files "$FILES" \
      --mode create,walk,chmod,unlink --runs 1 --json >"$OUT/inodes-$t-$r.json"
    jq -r --arg t "$t" --arg r "$r" \
      '.results[] | "\($r) \($t) inodes \(.mode) \(.tasks) \(.ops_per_sec.mean)"' \
      "$OUT/inodes-$t-$r.json" >>"$OUT/rates.txt"
  done
  for t in $order; do
    "$BIN/vfscale" bench herd --target kernel --dir "$BASE/$t" --tasks 20,1000 \
      --mode flock,posix,ofd --duration 1 --runs 1 --json >"$OUT/herd-$t-$r.json"
    jq -r --arg t "$t" --arg r "$r" \
      '.results[] | "\($r) \($t) herd \(.mode) \(.tasks) \(.acquisitions_per_sec.mean)"' \
      "$OUT/herd-$t-$r.json" >>"$OUT/rates.txt"
  done
  if command -v stress-ng >/dev/null; then
    for t in $order; do
      stress-ng --flock 2 --timeout 5 --temp-path "$BASE/$t" --metrics-brief \
        --yaml "$OUT/stress-ng-$t-$r.yaml" >"$OUT/stress-ng-$t-$r.log" 2>&1
      awk -v t="$t" -v r="$r" '/bogo-ops-per-second-real-time:/ { print r, t, "stress-ng flock 2", $2; exit }' \
        "$OUT/stress-ng-$t-$r.yaml" >>"$OUT/rates.txt"
    done
  fi
  echo "run $r ($order): load $(cut -d' ' -f1-3 /proc/loadavg)"
done

# Paired ratios io_uring ÷ /dev/fuse, per run and key.
awk '{ k = $3 " " $4 " " $5; v[$1 " " $2 " " k] = $6; ks[$1 " " k] = 1 }
  END { for (rk in ks) { split(rk, a, " "); k = a[2] " " a[3] " " a[4];
    u = v[a[1] " ur " k]; d = v[a[1] " df " k];
    if (u > 0 && d > 0) printf "run %s %-6s %-7s %4s io_uring %10.0f/s  /dev/fuse %10.0f/s  ratio %.3f\n", a[1], a[2], a[3], a[4], u, d, u / d } }' \
  "$OUT/rates.txt" | sort -k3,3 -k4,4 -k5,5n -k2,2n | tee "$OUT/ratios.txt"
sort -k3,3 -k4,4 -k5,5n -k11,11g "$OUT/ratios.txt" | awk '
  { k = $3 " " $4 " " $5; n[k]++; l[k] += log($NF); x[k, n[k]] = $NF }
  END { for (k in n) { m = n[k] % 2 ? x[k, (n[k] + 1) / 2] : (x[k, n[k] / 2] + x[k, n[k] / 2 + 1]) / 2;
    printf "%-22s io_uring ÷ /dev/fuse: geometric mean %.3f, median %.3f (%d runs)\n", k, exp(l[k] / n[k]), m, n[k] } }' | sort
# The herd's flatness over io_uring: 1000 ÷ 20 tasks, per run and mode.
awk '$3 == "herd" { v[$1 " " $2 " " $4 " " $5] = $6; ks[$1 " " $2 " " $4] = 1 }
  END { for (k in ks) { split(k, a, " ");
    if (v[k " 20"] > 0) printf "run %s %-3s herd %-5s flat 1000/20 %.3f\n", a[1], a[2] == "ur" ? "io_uring" : "/dev/fuse", a[3], v[k " 1000"] / v[k " 20"] } }' \
  "$OUT/rates.txt" | sort -k3,3 -k5,5 -k2,2n
