"""The recorder's cost on a training step, measured above the noise of a shared machine.

    PYTHON bench/bench_recorder.py [--seconds 180] [--microbatches 1] [--layers 6]

PYTHON: /usr/bin/python3 (Debian's torch 1.13) or the torch 2.x virtual environment that
scripts/setup.sh makes (${XDG_CACHE_HOME:-~/.cache}/fsdplab/torch2-venv/bin/python).

The model is the one of the recorder's field report: an embedding, torch.nn.TransformerEncoder
(6 layers, d_model 256, 4 heads, feed-forward 1024) and a head; units are the root and each
layer. One thread (torch.set_num_threads).

Method. A step of this model takes about 150-200 ms, and on a machine that other work shares
its time varies by 5-20% from one step to the next (the speed of the machine changes within
tens of milliseconds), more than the effect to measure. So four kinds of step take turns in
blocks:
  plain      a copy of the model that no recorder was ever attached to;
  plain'     the same copy again: plain' against plain is the noise floor (A against A);
  idle       the model a recorder is attached to, stepped outside rec.step();
  recording  the same model, inside rec.step().
A step can leave something to the step after it (caches, the allocator, garbage), so the orders
within blocks are the rows of a Williams square, cycled with the kinds shuffled at each cycle:
every kind follows every other kind equally often. (With random orders, one sequence of
orders, the same in every run of a seed, gave plain' - plain of +0.5% to +1.0% in three runs.)
Each block gives one relative difference per comparison (idle - plain, recording - idle,
plain' - plain, over the reference), so that drift slower than a block cancels; the result is
the median over the blocks, with a 95% confidence interval from resampling the blocks
(bootstrap, percentile). Recording is compared with idle on the same model object; idle with
plain, a different copy, so that whatever an attached recorder might leave on its model shows.
Times are the process's CPU time (time slices taken by other processes are not counted) and,
beside it, wall time. Garbage: after the warm-up the objects alive are frozen out of the
collector (gc.freeze) and gc.collect() runs before every timed step, for every kind alike;
collections during a step stay on (garbage a recorder makes is its cost). The recorder's own
time inside its hooks, as it measures it (rec.overhead()), is printed too.

The CI's width shrinks with the square root of the number of blocks: on the 2-core machine this
was written on, shared with a build and a fuzzer, 180 s (about 200 blocks) give about +-1%.
"""

import argparse
import copy
import gc
import os
import random
import statistics
import sys
import time

import torch
import torch.nn as nn

# The fsdplab package of this source tree (python/): no wheel needed, no compiled extension.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from fsdplab.torch import Recorder  # noqa: E402

KINDS = ("plain", "plain'", "idle", "recording")
# (name, kind, reference kind): each block's relative difference kind - reference.
COMPARISONS = (
    ("noise floor (plain' vs plain)", "plain'", "plain"),
    ("attached, idle (vs plain)", "idle", "plain"),
    ("recording (vs idle)", "recording", "idle"),
)
TARGET_PCT = 2.0
MIN_BLOCKS = 30  # fewer: a bootstrap CI of a median is not to be trusted


class Lm(nn.Module):
    def __init__(self, layers, d_model, vocab):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        layer = nn.TransformerEncoderLayer(
            d_model, nhead=4, dim_feedforward=4 * d_model, dropout=0.0, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, ids):
        return self.head(self.encoder(self.embed(ids)))


def step(model, batches, vocab):
    for ids in batches:
        logits = model(ids)
        nn.functional.cross_entropy(logits.reshape(-1, vocab), ids.reshape(-1)).backward()
    model.zero_grad(set_to_none=True)


def recorded_step(rec, model, batches, vocab):
    with rec.step():
        step(model, batches, vocab)
    rec._steps.clear()  # keep memory flat over many steps; the trace itself is not the subject


def williams_orders(kinds, rng):
    """Orders of the kinds in which each kind follows each other kind exactly once (a Williams
    square for an even number of kinds: rows 0, 1, n-1, 2, n-2, ... shifted), endlessly, with
    the kinds shuffled at every cycle of n orders."""
    n = len(kinds)
    first = [0]
    for i in range(1, n):
        first.append((i + 1) // 2 if i % 2 else n - i // 2)
    while True:
        perm = rng.sample(kinds, n)
        for shift in range(n):
            yield [perm[(j + shift) % n] for j in first]


def timed(fn):
    """(CPU ns, wall ns) of fn(), after collecting the garbage of what ran before."""
    gc.collect()
    c0, w0 = time.process_time_ns(), time.perf_counter_ns()
    fn()
    return time.process_time_ns() - c0, time.perf_counter_ns() - w0


def median_ci(values, rng, resamples=2000):
    """The median and a percentile-bootstrap 95% confidence interval of it."""
    n = len(values)
    meds = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(resamples))
    return statistics.median(values), meds[int(0.025 * resamples)], meds[int(0.975 * resamples)]


def verdict(lo, hi, floor_halfwidth, blocks):
    if blocks < MIN_BLOCKS:
        return f"not decided ({blocks} blocks: a CI needs at least {MIN_BLOCKS})"
    if hi <= TARGET_PCT:
        return f"at most {TARGET_PCT:g}%: met (the whole CI is below it)"
    if lo > TARGET_PCT:
        return f"at most {TARGET_PCT:g}%: NOT met (the whole CI is above it)"
    return (
        f"at most {TARGET_PCT:g}%: not decided (the CI straddles it; the noise floor's CI is "
        f"+-{floor_halfwidth:.2f}%: run longer)"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=180.0, help="timed blocks run this long")
    ap.add_argument("--blocks", type=int, default=0, help="a fixed number of blocks instead")
    ap.add_argument("--warmup", type=int, default=3, help="untimed blocks first")
    ap.add_argument("--seed", type=int, default=0, help="the order of kinds within blocks")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-saved-bytes", action="store_true", help="without saved-tensor hooks")
    ap.add_argument("--hooks", default="auto", help="the recorder's hooks= (auto or tensor)")
    args = ap.parse_args()
    if args.seconds <= 0 and args.blocks <= 0:
        ap.error("--seconds or --blocks must be positive")
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    base = Lm(args.layers, args.d_model, args.vocab)
    plain = copy.deepcopy(base)
    recorded = copy.deepcopy(base)
    rec = Recorder(
        recorded,
        units=lambda n, m: n.startswith("encoder.layers.") and n.count(".") == 2,
        saved_bytes=not args.no_saved_bytes,
        hooks=args.hooks,
    )
    batches = [
        torch.randint(0, args.vocab, (args.batch, args.seq)) for _ in range(args.microbatches)
    ]
    runs = {
        "plain": lambda: step(plain, batches, args.vocab),
        "plain'": lambda: step(plain, batches, args.vocab),
        "idle": lambda: step(recorded, batches, args.vocab),
        "recording": lambda: recorded_step(rec, recorded, batches, args.vocab),
    }
    orders = williams_orders(KINDS, random.Random(args.seed))
    for _ in range(args.warmup):
        for k in KINDS:
            runs[k]()
    gc.collect()
    gc.freeze()  # what is alive now is never garbage: later collections need not walk it
    cpu = {k: [] for k in KINDS}
    wall = {k: [] for k in KINDS}
    before = rec.overhead()
    start = time.perf_counter()
    blocks = 0

    def more():
        if args.blocks > 0:
            return blocks < args.blocks
        return time.perf_counter() - start < args.seconds

    while more():
        for k in next(orders):
            c, w = timed(runs[k])
            cpu[k].append(c)
            wall[k].append(w)
        blocks += 1
    elapsed = time.perf_counter() - start
    after = rec.overhead()
    rec.remove()

    print(
        f"torch {torch.__version__}, {args.layers} layers x d_model {args.d_model}, "
        f"batch {args.batch} x seq {args.seq}, {args.microbatches} microbatch(es), "
        f"{args.threads} thread(s), {len(rec.units)} units"
    )
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"{blocks} blocks of {len(KINDS)} steps in {elapsed:.0f} s (load average {load:.1f}); "
        f"plain step: median {statistics.median(cpu['plain']) / 1e6:.1f} ms CPU, "
        f"{statistics.median(wall['plain']) / 1e6:.1f} ms wall"
    )
    print("median of the per-block differences, [95% CI]:")
    boot_rng = random.Random(1)
    results = {}
    for name, kind, ref in COMPARISONS:
        cols = []
        for times in (cpu, wall):
            diffs = [100.0 * (a - b) / b for a, b in zip(times[kind], times[ref])]
            med, lo, hi = median_ci(diffs, boot_rng)
            cols.append(f"{med:+6.2f}% [{lo:+6.2f}, {hi:+6.2f}]")
            results.setdefault(kind, (med, lo, hi))
        print(f"  {name:31s} CPU {cols[0]}   wall {cols[1]}")
    _, flo, fhi = results["plain'"]
    _, lo, hi = results["recording"]
    print(f"recording, CPU time: {verdict(lo, hi, (fhi - flo) / 2, blocks)}")
    steps = max(blocks, 1)
    hooks = (after["hook_calls"] - before["hook_calls"]) / steps
    inside = (after["hook_total_us"] - before["hook_total_us"]) / steps
    plain_us = statistics.median(cpu["plain"]) / 1000.0
    print(
        f"hooks per recorded step {hooks:.0f}; the recorder's own time inside them "
        f"{inside:.0f} us per step ({100.0 * inside / plain_us:.2f}% of a plain step, wall time)"
    )


if __name__ == "__main__":
    main()
