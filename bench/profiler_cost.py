"""The PyTorch profiler's own cost per recorded operator, memory event and Python frame, on this
CPU.

    ~/.cache/fsdplab/torch2-venv/bin/python bench/profiler_cost.py [--iters N] [--rounds R]

Runs a loop of small operators (two per iteration, each allocating its output and freeing the
previous one: two operators and four memory events) on one thread, timed in process CPU time,
without the profiler and under torch.profiler with CPU activity alone, with record_shapes, and
with record_shapes and profile_memory, and with those and with_stack (the Python tracer), the
modes interleaved for R rounds. The difference per operator against the unprofiled loop is what
`fsdplab import-kineto --check` multiplies the profile's operator count by (its defaults are
this script's medians on the machine bench/README.md names; `--profiler-op-us` gives another
CPU's). The stack mode's loop body is a Python function, so the tracer records a frame for it
and for each call into torch; its cost over shapes+memory per recorded Python frame (counted in
its exported trace) is what `--check` multiplies a with_stack profile's frames by. Prints one
JSON line per mode.
"""

import argparse
import json
import os
import statistics
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity, profile

MODES = {
    "none": None,
    "cpu": dict(record_shapes=False, profile_memory=False),
    "shapes": dict(record_shapes=True, profile_memory=False),
    "shapes+memory": dict(record_shapes=True, profile_memory=True),
    "shapes+memory+stack": dict(record_shapes=True, profile_memory=True, with_stack=True),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    a, b = torch.randn(64, 64), torch.randn(64, 64)

    def body():  # a Python frame per iteration, as a model's modules are
        c = torch.add(a, b)
        c.mul(2)

    def loop():
        t0 = time.process_time()
        for _ in range(args.iters):
            body()
        return time.process_time() - t0

    loop()  # warm-up
    cpu_s = {m: [] for m in MODES}
    frames = []  # Python frames the stack mode's profiles recorded, per round
    for _ in range(args.rounds):
        for mode, kw in MODES.items():
            if kw is None:
                cpu_s[mode].append(loop())
                continue
            with profile(activities=[ProfilerActivity.CPU], **kw) as prof:
                cpu_s[mode].append(loop())
            if kw.get("with_stack"):
                frames.append(count_frames(prof))
    ops = 2 * args.iters
    base = statistics.median(cpu_s["none"])
    for mode, xs in cpu_s.items():
        med = statistics.median(xs)
        line = {"mode": mode, "us_per_op": round(med * 1e6 / ops, 3),
                "extra_us_per_op": round((med - base) * 1e6 / ops, 3),
                "rounds": len(xs), "ops": ops, "torch": torch.__version__}
        if MODES[mode] and MODES[mode].get("with_stack"):
            n = statistics.median(frames)
            extra = med - statistics.median(cpu_s["shapes+memory"])
            line.update(python_frames=n, extra_us_per_frame=round(extra * 1e6 / n, 3))
        print(json.dumps(line))


def count_frames(prof):
    """The "python_function" events of a finished profile (its exported Chrome trace)."""
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as f:
            events = json.load(f)["traceEvents"]
        return sum(1 for e in events if e.get("cat") == "python_function")
    finally:
        os.unlink(path)


if __name__ == "__main__":
    main()
