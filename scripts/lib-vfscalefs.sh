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

# use_binaries PACKAGE...: sets BIN, where the binaries are: as given, or the packages
# built into target/release.
use_binaries() {
  if [ -z "${BIN:-}" ]; then
    local p args=()
    for p in "$@"; do args+=(-p "$p"); done
    cargo build --release -q "${args[@]}"
    BIN=target/release
  fi
}
