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

# wakeup_control: one line, what waking a sleeping process costs on this machine (the
# lab's wake-up control, a ring of 2 processes on one CPU and across two), to read the
# figures through FUSE with: a request over /dev/fuse pays up to two such wake-ups.
wakeup_control() {
  "$BIN/vfscale" bench wakeup --tasks 2 --runs 3 --duration 0.5 --json 2>/dev/null |
    jq -r 'def us: if . == null then "not measured" else "\(. / 10 | round / 100) µs" end;
      [.results[] | {(.mode): .handoff_ns.mean}] | add // {}
      | "wake-up (vfscale bench wakeup --tasks 2): one CPU \(."one-cpu" | us), across two \(."two-cpus" | us)"
        + (if ."one-cpu" and ."two-cpus" then " (\(."two-cpus" / ."one-cpu" * 10 | round / 10)×)" else "" end)' ||
    echo "wake-up: not measured"
}
