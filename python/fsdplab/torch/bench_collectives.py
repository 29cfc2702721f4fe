"""Time torch.distributed's all-gather and reduce-scatter on your own ranks, for `fsdplab calibrate`.

    torchrun --nproc-per-node 2 -m fsdplab.torch.bench_collectives --out calib/ \\
        [--trace trace.rank0.json | -b 64K -e 256M -f 2] [--fsdplab build/tools/fsdplab]

Every rank times `all_gather_into_tensor` and `reduce_scatter_tensor` (fp32, out of place) at each
size: the sizes of a trace's collectives (its recorded `collective` events, else each unit's
parameters padded as FSDP2 pads them), or MIN, MIN*F, ... up to MAX. A call is timed on every
rank after a barrier, from the call to its return (CUDA: synchronised), and its time is the
shortest of the ranks' (the last rank to arrive barely waits: what `simulate` costs a collective
at, as it does the spans a recorded trace measured); a size's time is the mean over the calls.

Rank 0 writes OUT/all_gather.rows and OUT/reduce_scatter.rows (`SIZE_BYTES TIME_US` lines, the
full buffer: the all-gather's output, the reduce-scatter's input). With --fsdplab it then runs
`fsdplab bench-gather --rows` on each (nccl-tests text, OUT/all_gather.txt, OUT/reduce_scatter.txt)
and `fsdplab calibrate` on both, writing OUT/cluster.json for `fsdplab simulate --cluster`.

The backend is the process group's: gloo on CPU tensors, nccl on the local GPU (--backend to
choose; torchrun's variables give the ranks).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist

_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_ELEMENT = 4  # fp32
_DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "mxfp8": 1}


def parse_size(text):
    """'64K' -> 65536 (powers of 1024, as fsdplab's sizes)."""
    t = text.strip().upper()
    unit = t[-1] if t and t[-1] in _SUFFIX else ""
    return int(float(t[: len(t) - len(unit)]) * _SUFFIX[unit])


def sweep_sizes(lo, hi, factor):
    sizes, s = [], lo
    while s <= hi:
        sizes.append(s)
        s *= factor
    return sizes


def trace_sizes(path, world):
    """{kind: sorted sizes}: the trace's measured collectives, else its units' padded parameters
    (each parameter padded to a multiple of the ranks on its first dimension, fp32 elements
    counted as the trace's dtype bytes)."""
    with open(path, encoding="utf-8") as f:
        trace = json.load(f)
    kinds = {"all_gather": set(), "reduce_scatter": set()}
    for step in trace.get("steps", []):
        for mb in step.get("microbatches", []):
            for e in mb.get("events", []):
                if e.get("op") == "collective" and e.get("kind") in kinds and e.get("bytes"):
                    kinds[e["kind"]].add(int(e["bytes"]))
    if not any(kinds.values()):
        for u in trace.get("units", []):
            total = 0
            for p in u.get("params", []):
                numel = p.get("numel")
                shape = p.get("shape")
                if shape:
                    rows = shape[0]
                    rest = 1
                    for d in shape[1:]:
                        rest *= d
                    numel = -(-rows // world) * world * rest
                else:
                    numel = -(-int(numel or 0) // world) * world
                total += numel * _DTYPE_BYTES.get(p.get("dtype"), 4)
            if total:
                kinds["all_gather"].add(total)
                kinds["reduce_scatter"].add(total)
    return {k: sorted(v) for k, v in kinds.items()}


def time_calls(op, device, warmup, iters):
    """Each call's time on this rank (us), after a barrier."""
    times = []
    for i in range(warmup + iters):
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        op()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e6)
    return times


def bench(kind, sizes, world, device, warmup, iters):
    """[(size, mean us)]: per call the shortest of the ranks' times, then the mean over calls."""
    rows = []
    for size in sizes:
        n = max(size // (_ELEMENT * world), 1)  # elements per rank
        if kind == "all_gather":
            shard = torch.ones(n, device=device)
            full = torch.empty(n * world, device=device)

            def op():
                dist.all_gather_into_tensor(full, shard)

        else:
            full = torch.ones(n * world, device=device)
            shard = torch.empty(n, device=device)

            def op():
                dist.reduce_scatter_tensor(shard, full)

        mine = torch.tensor(time_calls(op, device, warmup, iters), dtype=torch.float64,
                            device=device)
        gathered = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(gathered, mine)
        shortest = torch.stack(gathered).min(dim=0).values.cpu()
        rows.append((n * world * _ELEMENT, statistics.fmean(shortest.tolist())))
    return rows


def run(cmd):
    print("+ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"fsdplab.torch.bench_collectives: {cmd[1]} failed ({p.returncode}):\n"
                         f"{p.stderr}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for the rows, nccl text and cluster.json")
    ap.add_argument("--trace", help="time the sizes of this fsdplab trace's collectives")
    ap.add_argument("-b", "--min-bytes", default="64K")
    ap.add_argument("-e", "--max-bytes", default="64M")
    ap.add_argument("-f", "--step-factor", type=int, default=2)
    ap.add_argument("-w", "--warmup", type=int, default=5)
    ap.add_argument("-n", "--iters", type=int, default=20)
    ap.add_argument("--backend", help="gloo or nccl (default: nccl with a GPU, else gloo)")
    ap.add_argument("--fsdplab", help="the fsdplab binary: also write the nccl-tests text and "
                                      "OUT/cluster.json")
    args = ap.parse_args()
    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if world < 2:
        raise SystemExit("fsdplab.torch.bench_collectives: needs at least 2 ranks (torchrun "
                         "--nproc-per-node 2 ...)")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if args.trace:
        sizes = trace_sizes(args.trace, world)
    else:
        s = sweep_sizes(parse_size(args.min_bytes), parse_size(args.max_bytes), args.step_factor)
        sizes = {"all_gather": s, "reduce_scatter": s}
    results = {}
    for kind in ("all_gather", "reduce_scatter"):
        if sizes[kind]:
            results[kind] = bench(kind, sizes[kind], world, device, args.warmup, args.iters)
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        for kind, rows in results.items():
            path = os.path.join(args.out, f"{kind}.rows")
            with open(path, "w", encoding="utf-8") as f:
                f.write(f"# torch.distributed {kind} ({backend}, {world} ranks, fp32, "
                        f"{device.type}): SIZE_BYTES TIME_US, the mean over {args.iters} calls "
                        "of the shortest rank's time\n")
                for size, us in rows:
                    f.write(f"{size} {us:.3f}\n")
            print(f"{path}: {len(rows)} sizes", flush=True)
        if args.fsdplab:
            texts = []
            for kind in results:
                text = os.path.join(args.out, f"{kind}.txt")
                run([args.fsdplab, "bench-gather", "--rows", os.path.join(args.out, f"{kind}.rows"),
                     "--op", kind, "--world-size", str(world), "-d", "float", "--nccl-out", text])
                texts.append(text)
            cluster = os.path.join(args.out, "cluster.json")
            per_node = os.environ.get("LOCAL_WORLD_SIZE", str(world))
            print(run([args.fsdplab, "calibrate", *texts, "--ranks", str(world),
                       "--gpus-per-node", per_node, "-o", cluster]), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
