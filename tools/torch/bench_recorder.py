"""Measures the recorder's cost per hook: the same training step with and without recording.

    /usr/bin/python3 tools/torch/bench_recorder.py [--units 32] [--width 64] [--steps 50]

Prints the CPU time of a step in both runs (median), the hooks one recorded step fires, the
end-to-end cost per hook ((recorded - plain) / hooks) and the time spent inside the hooks as the
recorder measures it (rec.overhead()). CPU, small layers, so that hook costs are not hidden by
compute.
"""

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fsdplab_record  # noqa: E402


class Net(nn.Module):
    def __init__(self, units, width):
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(units)
        )

    def forward(self, x):
        x = self.inp(x)
        for layer in self.layers:
            x = layer(x)
        return x


def step(model, x, microbatches):
    for _ in range(microbatches):
        model(x).sum().backward()


def cpu_us(fn):
    # CPU time of the process, not wall time: on a shared machine, time slices lost to other
    # processes would otherwise land on whichever run they hit.
    t0 = time.process_time_ns()
    fn()
    return (time.process_time_ns() - t0) / 1000.0


def recorded_step(rec, model, x, microbatches):
    with rec.step():
        step(model, x, microbatches)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--units", type=int, default=32)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--microbatches", type=int, default=2)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--no-saved-bytes", action="store_true", help="without saved-tensor hooks")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    plain = Net(args.units, args.width)
    recorded = Net(args.units, args.width)
    recorded.load_state_dict(plain.state_dict())
    rec = fsdplab_record.Recorder(recorded, saved_bytes=not args.no_saved_bytes)
    x = torch.randn(args.batch, args.width)

    for _ in range(3):  # warm up both
        step(plain, x, args.microbatches)
        with rec.step():
            step(recorded, x, args.microbatches)
    # Plain and recorded steps alternate, so that drift in the machine's speed hits both alike.
    plain_us, recorded_us = [], []
    before = rec.overhead()
    for _ in range(args.steps):
        plain_us.append(cpu_us(lambda: step(plain, x, args.microbatches)))
        recorded_us.append(cpu_us(lambda: recorded_step(rec, recorded, x, args.microbatches)))
    after = rec.overhead()
    base, with_rec = statistics.median(plain_us), statistics.median(recorded_us)
    hooks = (after["hook_calls"] - before["hook_calls"]) / args.steps
    inside = (after["hook_total_us"] - before["hook_total_us"]) / (hooks * args.steps)
    print(f"torch {torch.__version__}, {args.units} units x {args.microbatches} microbatches")
    print(f"step without recorder  {base:10.1f} us CPU (median of {args.steps})")
    print(f"step with recorder     {with_rec:10.1f} us")
    print(f"hooks per step         {hooks:10.0f}")
    print(f"end-to-end per hook    {(with_rec - base) / hooks:10.2f} us")
    print(f"inside hooks per hook  {inside:10.2f} us (wall clock, as rec.overhead() reports)")


if __name__ == "__main__":
    main()
