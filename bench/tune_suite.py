"""`fsdplab tune` on a suite of model shapes x memory caps: how good the search is, and how fast.

    python3 bench/tune_suite.py [--build BUILD_DIR] [--before FSDPLAB] [--aside] [--only NAME,...]

Each case is a synthetic trace (`fsdplab synth`), a cluster and a cap. The cap is placed between
what the caching allocator reserves with no prefetch at all (forward and backward budget 0, no
first-unit prefetch: P0) and with two units each way (P2): cap = P0 + f x (P2 - P0), from f = 0
("nothing fits with prefetch") to f >= 1 ("everything fits"), so that no case is tuned to a
number. Per case the table gives, from a reference `fsdplab tune --json` run of this build with a
600 s time limit: the best global policy under the cap, the best structured policy (prefix/suffix
windows, headroom-following budgets, the last units kept after forward) and its family, and the
exact optimum where the space of per-unit budgets 0..2 is small enough (`--exact-max`, default
20,000 policies); then the tuner's result from a second run, pinned to one core (`taskset -c
0`), under the time limit (default 8 s) and without the exact part (`--exact-max 0`): its step
time, its gain over the best global policy, its CPU time (user + sys of the tune process), its
policies per second (distinct policies simulated / the CPU seconds of the tune process) and why
it stopped.
`--before` also runs another fsdplab's tune on the same case, pinned and limited the same way
(e.g. an older build; its text output is read; an older build's limit may count wall seconds):
its step time, CPU time and policies per second fill the "before" columns.

Checks (a failing case is marked and the script exits 1): the tuner is never slower than the
best structured policy (0.01% slack for the printed rounding), and within 1% of the exact optimum
where that was computed. A case that cannot run fails loudly.

The cases marked `aside` were not looked at while the search was developed: run them with
--aside to see whether what holds on the others holds there too.
"""

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name, synth flags, cluster flags, cap fraction f (or an absolute cap), aside
CASES = [
    ("s3-dense-mb2-slow", "--layers 3 --hidden 1024 --ffn 4096 --heads 16 --vocab 32000 "
     "--microbatches 2", "--world-size 8 --intra-bw 20", 0.5, False),
    ("s4-mxfp8-reentrant", "--layers 4 --hidden 2048 --ffn 8192 --heads 16 --dtype mxfp8 "
     "--recompute reentrant", "--world-size 16 --inter-bw 10", 0.5, False),
    ("s4-dense-inside-mb3", "--layers 4 --hidden 1536 --ffn 6144 --heads 12 --recompute inside "
     "--microbatches 3", "--world-size 64 --inter-bw 12", 0.25, False),
    ("s3-mxfp8-mb4-roomy", "--layers 3 --hidden 2048 --ffn 8192 --heads 16 --dtype mxfp8 "
     "--microbatches 4", "--world-size 8", 1.2, False),
    ("m8-dense-tight", "--layers 8 --hidden 4096 --ffn 14336 --heads 32 --kv-heads 8 --seq 4096",
     "--world-size 256 --inter-bw 25", 0.0, False),
    ("m12-mxfp8-reentrant-mb2", "--layers 12 --hidden 4096 --ffn 16384 --heads 32 --dtype mxfp8 "
     "--recompute reentrant --microbatches 2", "--world-size 512 --inter-bw 25", 0.5, False),
    ("m16-dense-mb4", "--layers 16 --hidden 2048 --ffn 8192 --heads 16 --microbatches 4",
     "--world-size 64 --inter-bw 20", 0.75, False),
    ("l32-dense-reentrant", "--layers 32 --hidden 4096 --ffn 11008 --heads 32 "
     "--recompute reentrant", "--world-size 1024 --inter-bw 25", 0.5, False),
    ("l40-mxfp8-mixed", "--layers 40 --hidden 5120 --ffn 13824 --heads 40 --dtype mxfp8 "
     "--recompute inside --dtype-recompute-every 2", "--world-size 2048 --inter-bw 40", 0.3, False),
    ("l80-llama70b-16G", "--layers 80 --hidden 8192 --ffn 28672 --heads 64 --kv-heads 8 "
     "--vocab 128256 --recompute reentrant", "--world-size 1024 --inter-bw 25", "16G", False),
    ("l60-dense-4096", "--layers 60 --hidden 6144 --ffn 16384 --heads 48 --kv-heads 8",
     "--world-size 4096", 0.6, False),
    ("m6-dense-mb2-roomy", "--layers 6 --hidden 2048 --ffn 5632 --heads 16 --microbatches 2",
     "--world-size 32 --inter-bw 15", 0.9, False),
    # Kept aside while the search was developed.
    ("a-s4-dense-reentrant-mb2", "--layers 4 --hidden 3072 --ffn 8192 --heads 24 "
     "--recompute reentrant --microbatches 2", "--world-size 128 --inter-bw 20", 0.4, True),
    ("a-m10-mxfp8-inside", "--layers 10 --hidden 3072 --ffn 12288 --heads 24 --dtype mxfp8 "
     "--recompute inside", "--world-size 1024 --inter-bw 30", 0.6, True),
    ("a-l48-dense-selective", "--layers 48 --hidden 8192 --ffn 22016 --heads 64 --kv-heads 8 "
     "--recompute selective --microbatches 2", "--world-size 4096 --inter-bw 25", 0.2, True),
    ("a-s3-mxfp8-tight-mb3", "--layers 3 --hidden 4096 --ffn 11008 --heads 32 --dtype mxfp8 "
     "--microbatches 3", "--world-size 32 --inter-bw 8", 0.1, True),
]


REFERENCE_TIME_LIMIT = "600"


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode not in (0, 3):
        raise SystemExit(f"FAILED ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-2000:]}")
    return r


def held(fsdplab, trace, cluster, *policy):
    """What the cap holds of one policy: the larger of reserved and the tensors' peak. A step
    that fails without every plane in backward (MXFP8 recomputed) runs with them, as tune's
    global grid does."""
    r = run([fsdplab, "simulate", trace, "--json", *cluster, *policy])
    if r.returncode == 3:
        r = run([fsdplab, "simulate", trace, "--json", *cluster, *policy,
                 "--unshard-all-planes-in-backward", "all"])
    doc = json.loads(r.stdout)
    if r.returncode != 0 or doc["errors"]:
        raise SystemExit(f"FAILED: {' '.join(policy)} does not run on {trace}: {doc['errors']}")
    s = doc["summary"]
    return max(s["peak_reserved_bytes"], s["peak_memory_bytes"])


def timed(cmd):
    """(stdout, CPU seconds of the child: user + sys)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = run(cmd)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return r.stdout, cpu


def ms(row):
    return None if row is None else row["step_time_us"] / 1000.0


def fmt_ms(v):
    return "-" if v is None else f"{v:,.1f}"


def old_tuner_result(text):
    """The tuner's step time (ms), policies simulated and why it stopped, from an older fsdplab's
    text output (no result when nothing fits)."""
    m = re.search(r"^tuned policy:\s+step ([0-9.,]+) ms", text, re.M)
    n = re.search(r"^([0-9]+) policies simulated in", text, re.M)
    if n is None:
        raise SystemExit(f"cannot read the older tuner's output:\n{text[:2000]}")
    stop = "time_limit" if "stopped by the time limit" in text else "local_optimum"
    return (float(m.group(1).replace(",", "")) if m else None, int(n.group(1)), stop)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--before", help="another fsdplab whose tune fills the 'before' columns")
    ap.add_argument("--aside", action="store_true", help="run the cases kept aside instead")
    ap.add_argument("--only", help="comma-separated case names")
    ap.add_argument("--time-limit", default="8")
    args = ap.parse_args()
    fsdplab = os.path.join(args.build, "tools", "fsdplab")
    cases = [c for c in CASES if c[4] == args.aside]
    if args.only:
        names = set(args.only.split(","))
        cases = [c for c in CASES if c[0] in names]
    rows, failed = [], []
    totals, before_totals = [0, 0.0], [0, 0.0]  # policies simulated, CPU seconds
    with tempfile.TemporaryDirectory() as work:
        for name, synth, cluster_text, cap_spec, _ in cases:
            trace = os.path.join(work, name + ".json")
            cluster = cluster_text.split()
            world = cluster[cluster.index("--world-size") + 1]
            run([fsdplab, "synth", *synth.split(), "--world-size", world, "-o", trace])
            if isinstance(cap_spec, str):
                cap, f_text = cap_spec, cap_spec
            else:
                lo = held(fsdplab, trace, cluster, "--forward-prefetch", "0",
                          "--backward-prefetch", "0", "--prefetch-first-unit", "false")
                hi = held(fsdplab, trace, cluster, "--forward-prefetch", "2",
                          "--backward-prefetch", "2")
                cap, f_text = str(int(lo + cap_spec * (hi - lo))), f"f={cap_spec}"
            tune = [fsdplab, "tune", trace, *cluster, "--memory-cap", cap, "--json"]
            # The reference columns: the same global grid and structured families, and the exact
            # search given all the time it needs (it claims nothing unless every policy ran).
            ref = json.loads(run([*tune, "--time-limit", REFERENCE_TIME_LIMIT]).stdout)
            g, s, exact = ref.get("global_best"), ref.get("structured_best"), ref.get("exact")
            # The tuner: the search alone (no exact part), under the time limit, on one core.
            out, cpu = timed(["taskset", "-c", "0", *tune, "--exact-max", "0",
                              "--time-limit", args.time_limit])
            r = json.loads(out)
            tuned, stop = ms(r.get("best")), r.get("stop")
            rate = r["simulated"] / cpu if cpu > 0 else None
            before = ()
            if args.before:
                text, bcpu = timed(["taskset", "-c", "0", args.before, "tune", trace, *cluster,
                                    "--memory-cap", cap, "--time-limit", args.time_limit])
                bms, bn, bstop = old_tuner_result(text)
                before = (fmt_ms(bms), f"{bcpu:.1f}", f"{bn / bcpu:.0f}" if bcpu > 0 else "-",
                          bstop)
                before_totals[0] += bn
                before_totals[1] += bcpu
            totals[0] += r["simulated"]
            totals[1] += cpu
            ex = ms(exact["best"]) if exact and exact.get("best") else None
            bad = []
            if tuned is not None and s is not None and tuned > ms(s) * 1.0001:
                bad.append("slower than structured")
            if tuned is not None and ex is not None and tuned > ex * 1.01:
                bad.append("> 1% above exact")
            if g is None:
                bad.append("no global policy fits: the case's cap is wrong")
            elif tuned is None:
                bad.append("no result")
            gain = (100.0 * (ms(g) - tuned) / ms(g)) if g and tuned else None
            rows.append((name, f_text, fmt_ms(ms(g)), fmt_ms(ms(s)),
                         (ref.get("structured_family") or "-"), fmt_ms(ex),
                         fmt_ms(tuned), "-" if gain is None else f"{gain:.1f}%",
                         f"{cpu:.1f}", "-" if rate is None else f"{rate:.0f}", stop or "-",
                         *before, ", ".join(bad) or "ok"))
            print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
            if bad:
                failed.append(name)
    head = ("case", "cap", "global ms", "structured ms", "family", "exact ms", "tuner ms",
            "gain", "CPU s", "policies/s", "stopped")
    if args.before:
        head += ("before ms", "before CPU s", "before policies/s", "before stopped")
    head += ("check",)
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    if totals[1] > 0:
        print(f"\npolicies simulated per CPU second of the tune process, all cases: "
              f"{totals[0] / totals[1]:.0f} ({totals[0]} in {totals[1]:.1f} s)")
    if before_totals[1] > 0:
        print(f"before: {before_totals[0] / before_totals[1]:.0f} per CPU second of the tune "
              f"process ({before_totals[0]} in {before_totals[1]:.1f} s)")
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
