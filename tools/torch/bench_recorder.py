"""The recorder's cost on a training step: without it, attached but idle, and recording.

    PYTHON tools/torch/bench_recorder.py [--layers 6] [--d-model 256] [--steps 30]

PYTHON: /usr/bin/python3 (Debian's torch 1.13) or the torch 2.x virtual environment that
scripts/setup.sh makes (${XDG_CACHE_HOME:-~/.cache}/fsdplab/torch2-venv/bin/python).

The model is the one of the recorder's field report: an embedding, torch.nn.TransformerEncoder
(6 layers, d_model 256, 4 heads, feed-forward 1024) and a head; units are the root and each
layer. Three runs take turns, step by step (so that drift in the machine's speed hits them
alike): plain (a copy never attached), and one model with a recorder
attached, stepped outside rec.step() (idle) and inside it (recording). Times are the process's
CPU time per step, median over the steps. Idle is compared with plain (a different copy of the
same weights: copies alone differ by a few percent here, so this is the noise of the comparison;
an idle recorder has no hook at all), recording with idle (the same model); as a ratio of
medians and as the median of each step's ratio to the step run beside it. Also prints the hooks
a recorded step fires and the time spent inside them as the recorder measures it
(rec.overhead()).
"""

import argparse
import copy
import os
import statistics
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fsdplab_record  # noqa: E402


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


def cpu_us(fn):
    # CPU time of the process, not wall time: on a shared machine, time slices lost to other
    # processes would otherwise land on whichever run they hit.
    t0 = time.process_time_ns()
    fn()
    return (time.process_time_ns() - t0) / 1000.0


def recorded_step(rec, model, batches, vocab):
    with rec.step():
        step(model, batches, vocab)
    rec._steps.clear()  # keep memory flat over many steps; the trace itself is not the subject


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=1)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-saved-bytes", action="store_true", help="without saved-tensor hooks")
    ap.add_argument("--hooks", default="auto", help="the recorder's hooks= (auto or tensor)")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    # "idle" and "recording" are the same model (the recorder attached to it runs its steps
    # outside and inside rec.step()): copies of a model at other addresses differ by a few
    # percent by themselves, which the "plain" copy (never attached) shows.
    plain = Lm(args.layers, args.d_model, args.vocab)
    recorded = copy.deepcopy(plain)
    idle = recorded
    rec = fsdplab_record.Recorder(
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
        "idle": lambda: step(idle, batches, args.vocab),
        "recording": lambda: recorded_step(rec, recorded, batches, args.vocab),
    }
    for _ in range(3):  # warm up all three
        for fn in runs.values():
            fn()
    times = {k: [] for k in runs}
    before = rec.overhead()
    for i in range(args.steps):
        order = list(runs) if i % 2 == 0 else list(reversed(runs))
        for k in order:
            times[k].append(cpu_us(runs[k]))
    after = rec.overhead()
    med = {k: statistics.median(v) for k, v in times.items()}
    # Paired: each step against the step run next to it, so that slow drift cancels. Recording
    # against idle: the same model, with and without rec.step().
    paired = {
        k: statistics.median(100.0 * (a - b) / b for a, b in zip(times[k], times[ref]))
        for k, ref in (("idle", "plain"), ("recording", "idle"))
    }
    hooks = (after["hook_calls"] - before["hook_calls"]) / args.steps
    inside = (after["hook_total_us"] - before["hook_total_us"]) / args.steps
    print(
        f"torch {torch.__version__}, {args.layers} layers x d_model {args.d_model}, "
        f"batch {args.batch} x seq {args.seq}, {args.microbatches} microbatch(es), "
        f"{args.threads} thread(s), {len(rec.units)} units"
    )
    print(f"step without recorder   {med['plain']:12.1f} us CPU (median of {args.steps})")
    for k, ref in (("idle", "plain"), ("recording", "idle")):
        pct = 100.0 * (med[k] - med[ref]) / med[ref]
        print(
            f"step, recorder {k:9s}{med[k]:12.1f} us   vs {ref:5s} {pct:+6.2f}% of medians, "
            f"{paired[k]:+6.2f}% paired (median of per-step ratios)"
        )
    spread = statistics.pstdev(times["plain"]) / med["plain"] * 100.0
    print(f"plain step spread (stdev/median) {spread:.2f}%: the noise floor of the overheads")
    print(f"hooks per recorded step {hooks:10.0f}, inside hooks {inside:10.1f} us per step "
          f"({100.0 * inside / med['plain']:.2f}% of a plain step)")
    rec.remove()


if __name__ == "__main__":
    main()
