"""What calling simulate() from Python costs over the C++ work it wraps.

    python bench/python_overhead.py [--repeat N]     # with the fsdplab package installed

For each case, per call, the CPU time (time.process_time, this process; the simulator runs on
the calling thread) of
  C++:     fsdplab._fsdplab.simulate(...), the binding alone: the trace read (or parsed from
           the dict's JSON), the policy and cluster resolved, the run simulated, the report
           written as JSON, by the library code `fsdplab simulate --json` runs;
  Python:  fsdplab.simulate(...), the function users call: that, plus turning the arguments
           into the binding's and the report's JSON into a dict (json.loads), and for a dict
           trace json.dumps of it.
The two alternate, the median of N calls each is kept; the overhead is Python / C++ - 1. Cases:
gpt_small (8 ranks) by path and as a dict, and gpt_small on 1,024 ranks of distinct speeds
(rank_jitter) by path and as a dict. Exits 1 when a case cannot run.
"""

import argparse
import json
import os
import statistics
import sys
import time

import fsdplab
from fsdplab import _fsdplab

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
GPT_SMALL = os.path.join(ROOT, "traces", "gpt_small.json")


def cpu_per_call(fn, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=30)
    args = ap.parse_args()
    with open(GPT_SMALL) as f:
        gpt_small = json.load(f)
    wide = {"world_size": 1024}
    cases = [
        ("gpt_small, 8 ranks, path", GPT_SMALL, None, {}),
        ("gpt_small, 8 ranks, dict", gpt_small, None, {}),
        ("gpt_small, 1024 ranks jittered, path", GPT_SMALL, wide, {"rank_jitter": "0.05:1"}),
        ("gpt_small, 1024 ranks jittered, dict", gpt_small, wide, {"rank_jitter": "0.05:1"}),
    ]
    print(f"{'case':<40} {'C++ ms':>9} {'Python ms':>10} {'overhead':>9}")
    worst = 0.0
    for name, trace, cluster, options in cases:
        def python_call():
            fsdplab.simulate(trace, cluster=cluster, **options)

        # The binding's arguments, made once outside the timed C++ call (as the API makes them).
        src = [(True, json.dumps(trace))] if isinstance(trace, dict) else [(False, trace)]
        clu = None if cluster is None else (True, json.dumps(cluster))
        settings = list((k, str(v)) for k, v in options.items())

        def cxx_call():
            code, message, _ = _fsdplab.simulate(src, None, None, clu, settings, False, False,
                                                 False)
            if code != 0:
                raise SystemExit(f"{name}: {message}")

        try:
            python_call()
            cxx_call()
        except fsdplab.Error as e:
            print(f"{name}: cannot run: {e}", file=sys.stderr)
            return 1
        cxx, py = [], []
        for _ in range(3):  # alternate in blocks so that drifts in load hit both
            cxx += cpu_per_call(cxx_call, max(1, args.repeat // 3))
            py += cpu_per_call(python_call, max(1, args.repeat // 3))
        c, p = statistics.median(cxx), statistics.median(py)
        overhead = p / c - 1
        worst = max(worst, overhead)
        print(f"{name:<40} {1e3 * c:>9.2f} {1e3 * p:>10.2f} {100 * overhead:>8.1f}%")
    print(f"worst overhead: {100 * worst:.1f}% (target: at most 5%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
