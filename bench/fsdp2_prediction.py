"""Real FSDP2 on this machine's CPU (fully_shard, gloo, 2 ranks), measured, recorded, predicted.

    PY bench/fsdp2_prediction.py run --out DIR [--layers 6 --d-model 256 --steps 8 ...]
    PY bench/fsdp2_prediction.py compare --out DIR REPORT.json [REPORT.json ...]

`run` starts one process per rank. Each rank:
  1. measures all_gather_into_tensor and reduce_scatter_tensor over a range of sizes (gloo, the
     same 2 ranks) and rank 0 writes the sizes and times (DIR/ag.rows, DIR/rs.rows), which
     `fsdplab bench-gather --rows` turns into nccl-tests text (DIR/ag.txt, DIR/rs.txt) for
     `fsdplab calibrate` (--fsdplab: the binary); measured again after the model's steps and
     written beside (ag2, rs2) so that drift shows;
  2. builds an embedding + torch.nn.TransformerEncoder (d_model 256, 4 heads, feed-forward 1024)
     + head, fully_shard on each layer and on the root (FSDP2's defaults: reshard after forward,
     the root excepted; backward prefetch of one unit; synchronous unshard);
  3. runs warm-up steps, then --steps measured steps (forward and backward; wall time from a
     barrier to the end of the backward, the larger of the two ranks per step) with
     --record-steps steps under the recorder between them (DIR/traces/trace.rankN.json), then
     one step under torch.profiler with profile_memory (the CPU allocator's peak during the
     step, plus the sharded parameters held before it).
`compare` prints, for each simulated report, predicted vs measured step time, exposed
communication and peak memory, and the error.

Measured exposed communication: the CPU computes and communicates on the same thread, so every
collective blocks it: the time inside the recorded steps' collectives (the union of the recorded
`collective` intervals), whether transferring or waiting for the other rank. The simulator
splits that into exposed communication (a transfer in progress) and idle (waiting for the other
rank to arrive): both are printed against it. Each recorded step is also compared with its own
simulation (same compute): that error is the model's, free of the machine's drift between
steps. Needs torch 2.x (fully_shard); see bench/fsdp2_prediction.sh.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools", "torch"))

SIZES = [2**k for k in range(16, 25)]  # 64 KiB .. 16 MiB of all ranks' data


def write_rows(path, rows):
    """The sizes (all ranks' bytes) and times of one collective, one `SIZE_BYTES TIME_US` line
    each: what `fsdplab bench-gather --rows` formats as nccl-tests text (the one writer of it)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("# size_bytes time_us (torch.distributed, gloo, CPU; bench/fsdp2_prediction.py)\n")
        for size, us in rows:
            f.write(f"{size} {us:.3f}\n")


def nccl_tests_text(fsdplab, rows_path, op, world, out_path):
    """nccl-tests text of the rows in `rows_path`, written by fsdplab (fp32: count = size / 4 /
    world, as the rows were timed)."""
    subprocess.run(
        [fsdplab, "bench-gather", "--rows", rows_path, "--op", op, "--world-size", str(world),
         "-d", "float", "--nccl-out", out_path],
        check=True, stdout=subprocess.DEVNULL,
    )


def bench_collectives(dist, torch, rank, world, iters=10, warmup=3):
    ag, rs = [], []
    for size in SIZES:
        shard = size // 4 // world
        inp = torch.ones(shard)
        out = torch.empty(shard * world)
        full = torch.ones(shard * world)
        part = torch.empty(shard)
        for op, rows in (
            (lambda: dist.all_gather_into_tensor(out, inp), ag),
            (lambda: dist.reduce_scatter_tensor(part, full), rs),
        ):
            for _ in range(warmup):
                op()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                op()
            rows.append((size, (time.perf_counter() - t0) / iters * 1e6))
    return ag, rs


def rank_main(args):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.fsdp import fully_shard

    import fsdplab_record

    rank, world = args.rank, 2
    torch.set_num_threads(args.threads)
    dist.init_process_group(
        "gloo", init_method="file://" + os.path.join(args.out, "store"), rank=rank,
        world_size=world,
    )

    def write(name, text):
        with open(os.path.join(args.out, name), "w", encoding="utf-8") as f:
            f.write(text)

    ag, rs = bench_collectives(dist, torch, rank, world)
    if rank == 0:
        write_rows(os.path.join(args.out, "ag.rows"), ag)
        write_rows(os.path.join(args.out, "rs.rows"), rs)

    class Lm(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(args.vocab, args.d_model)
            layer = nn.TransformerEncoderLayer(
                args.d_model, nhead=4, dim_feedforward=4 * args.d_model, dropout=0.0,
                batch_first=True,
            )
            self.encoder = nn.TransformerEncoder(
                layer, num_layers=args.layers, enable_nested_tensor=False
            )
            self.head = nn.Linear(args.d_model, args.vocab)

        def forward(self, ids):
            return self.head(self.encoder(self.embed(ids)))

    torch.manual_seed(0)
    model = Lm()
    for layer in model.encoder.layers:
        fully_shard(layer)
    fully_shard(model)
    torch.manual_seed(1 + rank)  # each rank its own data, as in data parallelism
    ids = torch.randint(0, args.vocab, (args.batch, args.seq))

    def step():
        logits = model(ids)
        nn.functional.cross_entropy(logits.reshape(-1, args.vocab), ids.reshape(-1)).backward()

    for _ in range(args.warmup):
        step()
        model.zero_grad(set_to_none=True)
    # Measured and recorded steps interleave, so that both see the machine in the same state
    # (its speed drifts by tens of percent over a minute when other work shares the cores).
    rec = fsdplab_record.Recorder(model)
    every = max(1, args.steps // max(1, args.record_steps))
    times = []
    for i in range(args.steps):
        dist.barrier()
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e6)
        model.zero_grad(set_to_none=True)
        if i % every == 0 and len(rec.trace()["steps"]) < args.record_steps:
            dist.barrier()
            with rec.step():
                step()
            model.zero_grad(set_to_none=True)
    traces = os.path.join(args.out, "traces")
    os.makedirs(traces, exist_ok=True)
    rec.save(os.path.join(traces, "trace.json"))
    rec.remove()

    # Peak memory of one step: the CPU allocator's running total of what was allocated since the
    # profiler started (so: what the step added), plus the sharded parameters held before it.
    from torch.profiler import ProfilerActivity, profile

    sharded = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    peak_added = 0

    def walk(node):
        nonlocal peak_added
        extra = node.extra_fields
        if type(extra).__name__.endswith("Allocation") and str(extra.device) == "cpu":
            peak_added = max(peak_added, int(extra.total_allocated))
        for child in node.children:
            walk(child)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root)
    model.zero_grad(set_to_none=True)

    ag2, rs2 = bench_collectives(dist, torch, rank, world)
    if rank == 0:
        write_rows(os.path.join(args.out, "ag2.rows"), ag2)
        write_rows(os.path.join(args.out, "rs2.rows"), rs2)
    write(
        f"measured.rank{rank}.json",
        json.dumps(
            {
                "torch": torch.__version__,
                "step_times_us": times,
                "sharded_param_bytes": sharded,
                "peak_added_bytes": peak_added,
                "peak_memory_bytes": sharded + peak_added,
                "config": vars(args),
            },
            indent=1,
        ),
    )
    dist.destroy_process_group()


def run(args):
    os.makedirs(args.out, exist_ok=True)
    store = os.path.join(args.out, "store")
    if os.path.exists(store):
        os.unlink(store)
    procs = []
    for r in range(2):
        cmd = [sys.executable, os.path.abspath(__file__), "rank", "--rank", str(r)]
        for k in ("out", "layers", "d_model", "vocab", "batch", "seq", "steps", "warmup",
                  "threads", "record_steps"):
            cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
        procs.append(subprocess.Popen(cmd))
    rc = [p.wait() for p in procs]
    if any(rc):
        sys.exit(f"fsdp2_prediction: a rank failed ({rc})")
    for name, op in (("ag", "all_gather"), ("rs", "reduce_scatter"), ("ag2", "all_gather"),
                     ("rs2", "reduce_scatter")):
        nccl_tests_text(args.fsdplab, os.path.join(args.out, f"{name}.rows"), op, 2,
                        os.path.join(args.out, f"{name}.txt"))
    ranks = []
    for r in range(2):
        with open(os.path.join(args.out, f"measured.rank{r}.json"), encoding="utf-8") as f:
            ranks.append(json.load(f))
    per_step = [max(a, b) for a, b in zip(ranks[0]["step_times_us"], ranks[1]["step_times_us"])]
    exposed, compute, excluded, spans, blocked = measured_from_trace(args.out)
    summary = {
        "recorded_step_spans_us": spans,
        "recorded_step_comm_us": blocked,
        "step_time_us": statistics.median(per_step),
        "step_times_us": per_step,
        "exposed_comm_us": exposed,
        "recorded_compute_us": compute,
        "fsdp_excluded_us": excluded,
        "peak_memory_bytes": max(r["peak_memory_bytes"] for r in ranks),
        "torch": ranks[0]["torch"],
    }
    with open(os.path.join(args.out, "measured.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps({k: v for k, v in summary.items() if k != "step_times_us"}))


def union_length(intervals):
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def measured_from_trace(out):
    """From the recorded steps: per step, the larger of the two ranks' spans (first event to
    backward_end) and of their time inside collectives (the union of the recorded `collective`
    intervals: on the CPU each blocks the thread that computes, whether it transfers or waits
    for the other rank); the median of those over steps; rank 0's median compute, and the time
    the recorder excluded as FSDP's own work per step."""
    per_rank = []
    for r in range(2):
        with open(os.path.join(out, "traces", f"trace.rank{r}.json"), encoding="utf-8") as f:
            trace = json.load(f)
        rows = []
        for step in trace["steps"]:
            events = [e for mb in step["microbatches"] for e in mb["events"]]
            coll = [(e["start_us"], e["end_us"]) for e in events if e["op"] == "collective"]
            rows.append(
                (
                    max(e.get("ts_us", 0.0) for e in events),
                    union_length(coll),
                    sum(e["us"] for e in events if e["op"] == "compute"),
                )
            )
        excluded = trace["meta"]["recorder"].get("fsdp_excluded_us", 0.0) / len(trace["steps"])
        per_rank.append((rows, excluded))
    spans = [max(a[0], b[0]) for a, b in zip(per_rank[0][0], per_rank[1][0])]
    blocked = [max(a[1], b[1]) for a, b in zip(per_rank[0][0], per_rank[1][0])]
    compute = statistics.median(row[2] for row in per_rank[0][0])
    return statistics.median(blocked), compute, per_rank[0][1], spans, blocked


def compare(args):
    with open(os.path.join(args.out, "measured.json"), encoding="utf-8") as f:
        m = json.load(f)
    steps = m["step_times_us"]
    spread = 100.0 * (max(steps) - min(steps)) / m["step_time_us"]
    print(
        f"measured (torch {m['torch']}, FSDP2, gloo, 2 ranks): step {m['step_time_us']:.0f} us "
        f"(median of {len(steps)}; min {min(steps):.0f}, max {max(steps):.0f}: a spread of "
        f"{spread:.0f}% of the median), time in collectives {m['exposed_comm_us']:.0f} us, "
        f"peak memory {m['peak_memory_bytes']} B"
    )
    spans = ", ".join(f"{x:.0f}" for x in m["recorded_step_spans_us"])
    print(
        f"recorded steps: {spans} us; rank 0's compute {m['recorded_compute_us']:.0f} us and "
        f"FSDP's own time {m['fsdp_excluded_us']:.0f} us per step (medians)"
    )
    fmt = "{:<44s} {:>12s} {:>12s} {:>8s}"
    for path in args.reports:
        with open(path, encoding="utf-8") as f:
            report = json.load(f)
        s = report["summary"]
        print(f"\n{os.path.basename(path)}")
        print(fmt.format("", "predicted", "measured", "error"))
        # Each recorded step against its own simulation (the same compute, so the machine's
        # drift between steps cancels): what the communication model gets right or wrong.
        for i, (step, span) in enumerate(zip(report["steps"], m["recorded_step_spans_us"])):
            err = 100.0 * (step["time_us"] - span) / span
            print(fmt.format(f"recorded step {i} (us)", f"{step['time_us']:.0f}", f"{span:.0f}",
                             f"{err:+.1f}%"))
        pred_blocked = s["exposed_comm_us"] + s["idle_us"]
        for name, pred, meas in (
            ("step time, median of unrecorded steps (us)", s["step_time_us"], m["step_time_us"]),
            ("exposed communication (us)", s["exposed_comm_us"], m["exposed_comm_us"]),
            ("exposed communication + idle (us)", pred_blocked, m["exposed_comm_us"]),
            ("peak memory (bytes)", s["peak_memory_bytes"], m["peak_memory_bytes"]),
        ):
            err = 100.0 * (pred - meas) / meas if meas else float("nan")
            print(fmt.format(name, f"{pred:.0f}", f"{meas:.0f}", f"{err:+.1f}%"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("run", "rank"):
        p = sub.add_parser(name)
        p.add_argument("--out", required=True)
        p.add_argument("--layers", type=int, default=6)
        p.add_argument("--d-model", type=int, default=256)
        p.add_argument("--vocab", type=int, default=1000)
        p.add_argument("--batch", type=int, default=8)
        p.add_argument("--seq", type=int, default=64)
        p.add_argument("--steps", type=int, default=8)
        p.add_argument("--warmup", type=int, default=2)
        p.add_argument("--threads", type=int, default=1)
        p.add_argument("--record-steps", type=int, default=3)
        if name == "rank":
            p.add_argument("--rank", type=int, required=True)
        else:
            p.add_argument(
                "--fsdplab",
                default=os.environ.get(
                    "FSDPLAB_BIN", os.path.join(HERE, "..", "build", "tools", "fsdplab")),
                help="the fsdplab binary, which writes the nccl-tests text of the rows")
    p = sub.add_parser("compare")
    p.add_argument("--out", required=True)
    p.add_argument("reports", nargs="+")
    args = ap.parse_args()
    {"run": run, "rank": rank_main, "compare": compare}[args.cmd](args)


if __name__ == "__main__":
    main()
