#!/usr/bin/env python3
"""Predicted against measured step time on the host backend over a seeded grid of synthetic
workloads (issue 11), so that the prediction is shown off the bundled traces.

    bench/host_prediction.sh --grid [--seed N] [--count N] [--build DIR]

The grid spans compute/communication ratios 0.1-10, unit sizes 1-64 MB, 1-4 microbatches,
recompute none and reentrant, bf16 and MXFP8, prefetch budgets 0, 1 and 2, and 2 and 3 ranks.
Each dimension is stratified: its values are dealt out evenly over the workloads and shuffled
with the seed, so every value appears and the combinations vary with the seed.

The collective model is calibrated with `bench-gather` (all-gather, reduce-scatter, and
`--op concurrent` for the contention) for each world size, before and after the live runs, as
`bench/host_prediction.sh` does for the sample traces; nothing is fitted to the steps being
predicted. Each workload is run live REPEAT times (default 2, `--compute timed --no-check`);
the run with the median step time is compared with the simulation of the same trace and policy.

Prints a table (workload, predicted, measured, error, every run's step time), the median and
90th-percentile |error|, and the three worst cases with the op kind that carries most of the
error. Run it on an otherwise idle machine: the host collectives are memory copies on the same
cores, and other load shows up as error.
"""
import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile

MiB = 1024 * 1024


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr}")
    return r.stdout


def stratified(values, n, rng):
    out = [values[i % len(values)] for i in range(n)]
    rng.shuffle(out)
    return out


def log_stratified(lo, hi, n, rng):
    # n points, one in each of n equal log-width bins between lo and hi, shuffled.
    out = [math.exp(math.log(lo) + (i + rng.random()) / n * (math.log(hi) - math.log(lo)))
           for i in range(n)]
    rng.shuffle(out)
    return out


def layer_bytes(hidden, ffn, dtype):
    # synth's layer: q, k, v, o (hidden x hidden, k/v heads = heads), gate/up/down (hidden x
    # ffn), two RMSNorms (hidden). MXFP8 projections: 1 byte per element per plane, two planes,
    # plus one scale byte per 32 elements per plane; norms stay bf16.
    proj = 4 * hidden * hidden + 3 * hidden * ffn
    if dtype == "mxfp8":
        return 2 * (proj + proj // 32) + 2 * 2 * hidden
    return 2 * (proj + 2 * hidden)


def shape_for(target_bytes, dtype):
    # hidden a multiple of 64, ffn = 4 x hidden rounded to 64: the size nearest the target.
    best = None
    for hidden in range(64, 4096 + 1, 64):
        for ffn in (4 * hidden, 3 * hidden, 2 * hidden):
            b = layer_bytes(hidden, ffn, dtype)
            score = abs(math.log(b / target_bytes))
            if best is None or score < best[0]:
                best = (score, hidden, ffn, b)
    return best[1], best[2], best[3]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--build", default=os.path.join(os.path.dirname(__file__), "..", "build"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=24)
    ap.add_argument("--repeat", type=int, default=int(os.environ.get("REPEAT", "2")))
    ap.add_argument("--steps", type=int, default=int(os.environ.get("STEPS", "4")))
    ap.add_argument("--keep", help="keep the work files in this directory")
    ap.add_argument("--working-set", default=None,
                    help="bench-gather --working-set for the calibration (default: 8x this "
                         "machine's last-level cache, scripts/cold_working_set.sh: buffers cold "
                         "in the caches, as a live step over many units finds them; 0: one hot "
                         "buffer, as nccl-tests)")
    a = ap.parse_args()
    if a.working_set is None:
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts",
                              "cold_working_set.sh")
        a.working_set = subprocess.run(["bash", script], check=True, capture_output=True,
                                       text=True).stdout.strip()
    f = os.path.join(a.build, "tools", "fsdplab")
    if not os.access(f, os.X_OK):
        sys.exit(f"no fsdplab at {f}: build first")
    work = a.keep or tempfile.mkdtemp(prefix="fsdplab-grid-")
    os.makedirs(work, exist_ok=True)
    rng = random.Random(a.seed)
    n = a.count

    ratios = log_stratified(0.1, 10, n, rng)
    sizes = log_stratified(1, 64, n, rng)
    mbs = stratified([1, 2, 3, 4], n, rng)
    recompute = stratified(["none", "reentrant"], n, rng)
    dtypes = stratified(["bf16", "mxfp8"], n, rng)
    budgets = stratified([0, 1, 2], n, rng)
    worlds = stratified([2, 3], n, rng)

    sizes_flags = ["-b", "256K", "-e", "128M", "-f", "2", "-n", "10", "-w", "3"]
    ws_flags = ["--working-set", a.working_set]

    def bench(world, tag):
        for op in ("all_gather", "reduce_scatter"):
            run([f, "bench-gather", "--backend", "host", "--world-size", str(world), *sizes_flags,
                 *ws_flags, "--op", op, "--nccl-out", f"{work}/{op}{world}.{tag}.txt"])

    for w in sorted(set(worlds)):
        bench(w, 0)
        run([f, "bench-gather", "--backend", "host", "--world-size", str(w), *sizes_flags, "--op",
             "concurrent", "-J", f"{work}/concurrent{w}.json"])
    # A provisional model (before the runs) sizes the compute of each workload from its ratio.
    for w in sorted(set(worlds)):
        run([f, "calibrate", f"{work}/all_gather{w}.0.txt", f"{work}/reduce_scatter{w}.0.txt",
             "--contention", f"{work}/concurrent{w}.json", "-o", f"{work}/provisional{w}.json"])

    seq = 256
    workloads = []
    for i in range(n):
        dtype = dtypes[i]
        hidden, ffn, ubytes = shape_for(sizes[i] * MiB, dtype)
        w = worlds[i]
        cost = json.loads(run([f, "cost", "--cluster", f"{work}/provisional{w}.json",
                               "--collective", "all_gather", "--world-size", str(w), "--bytes",
                               str(ubytes), "--json"]))
        rows = cost if isinstance(cost, list) else cost.get("rows", cost.get("sizes", []))
        ag_us = float(rows[0]["time_us"])
        # Forward FLOPs of a layer: 2 x parameters x tokens; its compute should last ratio x the
        # layer's all-gather.
        params = 4 * hidden * hidden + 3 * hidden * ffn
        fwd_us = ratios[i] * ag_us
        tflops = 2.0 * params * seq / (fwd_us * 1e-6) / 1e12
        name = (f"w{i:02d}_{ubytes / MiB:.1f}MB_r{ratios[i]:.2f}_mb{mbs[i]}_{recompute[i]}_"
                f"{dtype}_b{budgets[i]}_W{w}")
        trace = f"{work}/{name}.json"
        run([f, "synth", "--layers", "4", "--hidden", str(hidden), "--ffn", str(ffn), "--heads",
             "8", "--vocab", "512", "--dtype", dtype, "--recompute", recompute[i],
             "--microbatches", str(mbs[i]), "--steps", "2", "--seq", str(seq), "--tflops",
             f"{tflops:.6g}", "--world-size", str(w), "-o", trace])
        policy = ["--forward-prefetch", str(budgets[i]), "--backward-prefetch", str(budgets[i])]
        workloads.append((name, trace, w, policy))

    for name, trace, w, policy in workloads:
        for r in range(a.repeat):
            run([f, "run", "--backend", "host", trace, "--world-size", str(w), "--steps",
                 str(a.steps), "--compute", "timed", "--no-check", *policy, "--json", "-o",
                 f"{work}/{name}.meas{r}.json"])

    for w in sorted(set(worlds)):
        bench(w, 1)
        run([f, "calibrate", f"{work}/all_gather{w}.0.txt", f"{work}/all_gather{w}.1.txt",
             f"{work}/reduce_scatter{w}.0.txt", f"{work}/reduce_scatter{w}.1.txt", "--contention",
             f"{work}/concurrent{w}.json", "-o", f"{work}/cluster{w}.json"])

    print(f"{'workload':<52} {'predicted us':>13} {'measured us':>13} {'error':>8}   "
          "measured step time of each run (us)")
    results = []
    for name, trace, w, policy in workloads:
        sim = f"{work}/{name}.sim.json"
        run([f, "simulate", trace, "--cluster", f"{work}/cluster{w}.json", "--world-size", str(w),
             "--steps", str(a.steps), *policy, "--json", "-o", sim])
        runs = []
        for r in range(a.repeat):
            path = f"{work}/{name}.meas{r}.json"
            with open(path) as fh:
                runs.append((json.load(fh)["summary"]["step_time_us"], path))
        runs.sort()
        median_path = runs[(len(runs) - 1) // 2][1]
        c = json.loads(run([f, "compare", sim, median_path, "--json"]))
        s = c["summary"]
        spread = (max(t for t, _ in runs) - min(t for t, _ in runs)) / s["step_time_measured_us"]
        # The op kind that carries most of the error: the largest |predicted - measured| summed.
        kinds = sorted(c["op_kinds"], key=lambda k: -abs(k["predicted_us"] - k["measured_us"]))
        carrier = (f"{kinds[0]['kind']} {kinds[0]['error_pct']:+.1f}% "
                   f"({(kinds[0]['predicted_us'] - kinds[0]['measured_us']) / 1000:+.1f} ms)"
                   if kinds else "-")
        results.append((name, s["step_time_predicted_us"], s["step_time_measured_us"],
                        s["step_time_error_pct"], spread, carrier))
        print(f"{name:<52} {s['step_time_predicted_us']:>13.1f} {s['step_time_measured_us']:>13.1f}"
              f" {s['step_time_error_pct']:>+7.1f}%   "
              + " ".join(f"{t:.0f}" for t, _ in runs))
    errs = sorted(abs(r[3]) for r in results)
    spreads = sorted(r[4] * 100 for r in results)
    p90 = errs[min(len(errs) - 1, math.ceil(0.9 * len(errs)) - 1)]
    print(f"\n{len(results)} workloads (seed {a.seed}): median |error| {statistics.median(errs):.1f}%,"
          f" 90th percentile {p90:.1f}%, largest {errs[-1]:.1f}%")
    print(f"run-to-run spread (max - min over {a.repeat} runs, of the measured step): median "
          f"{statistics.median(spreads):.1f}%, largest {spreads[-1]:.1f}%")
    print("worst three (the op kind carrying most of the error):")
    for r in sorted(results, key=lambda r: -abs(r[3]))[:3]:
        print(f"  {r[0]:<52} {r[3]:+.1f}%   {r[5]}")
    if a.keep:
        print(f"work files kept in {work}")


if __name__ == "__main__":
    main()
