"""What calling simulate() from Python costs over the C++ work it wraps.

    python bench/python_overhead.py [--repeat N]     # with the fsdplab package installed

For each case, per call, the CPU time (time.process_time, this process; the simulator runs on
the calling thread) of
  C++:     the C++ work a call wraps, from files: fsdplab._fsdplab.simulate(..., to_python=False)
           given the trace's and the cluster's files: the trace read and parsed, the policy and
           cluster resolved, the run simulated, the report built as a document (the value
           `fsdplab simulate --json` prints; not printed as text, not turned into Python objects);
  Python:  fsdplab.simulate(...), the function users call, on the same content: the same read,
           resolve and simulation, plus the arguments made, a dict trace or cluster written as
           JSON text in C++ (instead of read from a file), and the report's Python objects (a
           dict), made from the report itself in place of the document (report.h, EmitReport).
The two alternate, the median of N calls each is kept; the overhead is Python / C++ - 1. Beside
them, "report->dict": the binding from files with to_python=True (the Python objects, no
document) less the C++ work (the document, no Python objects): what making the dict costs over
making the document, negative when it costs less.
Cases:
gpt_small (8 ranks) by path and as a dict, and gpt_small on 1,024 ranks of distinct speeds
(rank_jitter) by path and as a dict (the cluster always a dict). Exits 1 when a case cannot run.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
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
    # The C++ work reads every document from a file: the cluster dict's content as one.
    tmp = tempfile.TemporaryDirectory()
    wide_file = os.path.join(tmp.name, "cluster.json")
    with open(wide_file, "w") as f:
        json.dump(wide, f)
    cases = [
        ("gpt_small, 8 ranks, path", GPT_SMALL, None, {}),
        ("gpt_small, 8 ranks, dict", gpt_small, None, {}),
        ("gpt_small, 1024 ranks jittered, path", GPT_SMALL, wide, {"rank_jitter": "0.05:1"}),
        ("gpt_small, 1024 ranks jittered, dict", gpt_small, wide, {"rank_jitter": "0.05:1"}),
    ]
    print(f"{'case':<40} {'C++ ms':>9} {'Python ms':>10} {'overhead':>9} {'report->dict ms':>16}")
    worst = -float("inf")
    for name, trace, cluster, options in cases:
        def python_call():
            fsdplab.simulate(trace, cluster=cluster, **options)

        # The binding's arguments, made once outside the timed C++ call: the files.
        clu = None if cluster is None else wide_file
        settings = list((k, str(v)) for k, v in options.items())

        def binding(to_python):
            code, message, report = _fsdplab.simulate([GPT_SMALL], None, None, clu, settings,
                                                      False, False, False, to_python=to_python)
            if code != 0 or (report is not None) != to_python:
                raise SystemExit(f"{name}: {message or 'the report (not) converted'}")

        def cxx_call():
            binding(False)

        def objects_call():
            binding(True)

        try:
            python_call()
            cxx_call()
        except fsdplab.Error as e:
            print(f"{name}: cannot run: {e}", file=sys.stderr)
            return 1
        cxx, py, objects = [], [], []
        for _ in range(3):  # alternate in blocks so that drifts in load hit all
            cxx += cpu_per_call(cxx_call, max(1, args.repeat // 3))
            py += cpu_per_call(python_call, max(1, args.repeat // 3))
            objects += cpu_per_call(objects_call, max(1, args.repeat // 3))
        c, p = statistics.median(cxx), statistics.median(py)
        o = statistics.median(objects) - c
        overhead = p / c - 1
        worst = max(worst, overhead)
        print(f"{name:<40} {1e3 * c:>9.2f} {1e3 * p:>10.2f} {100 * overhead:>8.1f}% "
              f"{1e3 * o:>16.3f}")
    print(f"worst overhead: {100 * worst:.1f}% (target: at most 5%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
