#!/usr/bin/env python3
"""Paired A/B of two builds of the lab: scripts/ab-paired.py BEFORE AFTER ROUNDS.

BEFORE and AFTER are two `vfscale` binaries (e.g. copies of target/release/vfscale built
at two commits). Each round runs every command below with A then B (B then A on odd
rounds, so neither always runs first), and the table gives, per configuration, the
median and geometric mean over rounds of B's figure over A's, then each round's ratio.
For rates above 1 means AFTER is faster; for `_ns` figures above 1 means it is slower."""
import json, subprocess, sys, math, collections
if len(sys.argv) != 4:
    sys.exit("usage: scripts/ab-paired.py BEFORE AFTER ROUNDS")
A, B, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
cmds = [
  ("herd", "bench herd --target library --tasks 20,1000 --mode flock,posix --runs 1 --duration 1", ["acquisitions_per_sec"]),
  ("lockmany", "bench lockmany --target library --held 10,10000 --mode posix --runs 1", None),
  ("inodes", "bench inodes --target library --tasks 1,2 --files 50000 --mode create,walk,chmod,unlink --runs 1", None),
]
def key(r):
    return (r["workload"], str(r.get("target")), str(r.get("mode")), r.get("tasks"), r.get("held"), r.get("files"))
def metrics(r, want):
    out = {}
    for k, v in r.items():
        if isinstance(v, dict) and "mean" in v:
            if want is None or k in want:
                out[k] = v["mean"]
    return out
ratios = collections.defaultdict(list)
for i in range(rounds):
    order = [("A", A), ("B", B)] if i % 2 == 0 else [("B", B), ("A", A)]
    for name, cmd, want in cmds:
        got = {}
        for tag, binp in order:
            p = subprocess.run([binp] + cmd.split() + ["--json"], capture_output=True, text=True)
            if p.returncode != 0:
                print(tag, name, "failed", p.stderr[-500:]); sys.exit(1)
            d = json.loads(p.stdout)
            got[tag] = {key(r): metrics(r, want) for r in d["results"]}
        for k, ma in got["A"].items():
            mb = got["B"].get(k, {})
            for m, va in ma.items():
                vb = mb.get(m)
                if vb and va and va > 0 and vb > 0:
                    ratios[(k, m)].append(vb / va)
    print(f"round {i} done", file=sys.stderr, flush=True)
print(f"{'configuration':46} {'metric':22} B/A median  geo-mean  (per round)")
for (k, m), rs in sorted(ratios.items()):
    if not any(s in m for s in ("per_sec", "_ns", "seconds")):
        continue
    if m.startswith("span_"):
        continue
    g = math.exp(sum(math.log(x) for x in rs) / len(rs))
    srt = sorted(rs); n = len(srt)
    med = srt[n // 2] if n % 2 else (srt[n // 2 - 1] + srt[n // 2]) / 2
    print(f"{'/'.join(str(x) for x in k if x is not None):46} {m:22} {med:6.3f}  {g:6.3f}    " + " ".join(f"{x:.2f}" for x in rs))
