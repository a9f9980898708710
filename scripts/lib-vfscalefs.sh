# Shared by the vfscalefs benchmark scripts (sourced).

# wait_for_server LOG: waits up to 10 s until the vfscalefs server writing LOG has said
# how it serves (its first line, once every mountpoint is mounted), then prints LOG.
wait_for_server() {
  for _ in $(seq 100); do
    grep -q "inodes by" "$1" 2>/dev/null && break
    sleep 0.1
  done
  cat "$1"
}
