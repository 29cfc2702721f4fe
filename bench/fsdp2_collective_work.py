"""Where FSDP2's collectives spend their time beyond the collective itself, on 2 gloo ranks.

    torchrun --standalone --nproc-per-node 2 bench/fsdp2_collective_work.py

Inside a training step FSDP2 (torch.distributed.fsdp._fully_shard._fsdp_collectives) does more
than the collective a bench times: the all-gather's copy-in (the rank's shards foreach-copied
into a freshly allocated input) and the reduce-scatter's (the unsharded gradients chunk_cat into
a fresh padded input, a fresh output, the division by the world). This times each variant at
three sizes (the grid's llama-s sizes and 8 MiB), interleaved per iteration so the machine's
load hits every variant alike; a call's time is the shortest of the ranks' (the last rank to
arrive barely waits: no arrival skew), a variant's the median over 30 calls. Printed as each
variant's ratio to the bare collective on preallocated buffers.
"""

import os
import statistics as st
import time

import torch
import torch.distributed as dist


def main():
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    r, w = dist.get_rank(), dist.get_world_size()
    os.sched_setaffinity(0, {r % os.cpu_count()})
    for size in (852992, 2097664, 8390656):
        m = size // 4 // (8 * w) * w  # 8 parameters of m fp32 elements each
        n = 8 * m
        grads = [torch.randn(m) for _ in range(8)]
        shards = [torch.randn(m // w) for _ in range(8)]
        full, out = torch.randn(n), torch.empty(n // w)
        ag_in, ag_out = torch.randn(n // w), torch.empty(n)

        def ag_bare():
            dist.all_gather_into_tensor(ag_out, ag_in)

        def ag_fsdp2():
            i = torch.empty(n // w)
            torch._foreach_copy_(list(torch.split(i, m // w)), shards)
            dist.all_gather_into_tensor(torch.empty(n), i)

        def rs_bare():
            dist.reduce_scatter_tensor(out, full)

        def rs_fresh_buffers():
            i = torch.empty(n)
            i.fill_(1.0)
            dist.reduce_scatter_tensor(torch.empty(n // w), i)

        def rs_fsdp2():
            i = torch.empty(n)
            torch._chunk_cat([g.view(w, -1) for g in grads], dim=1, num_chunks=w,
                             out=i.view(w, -1))
            o = torch.empty(n // w)
            dist.reduce_scatter_tensor(o, i)
            o.div_(w)

        variants = {"all_gather": ag_bare, "all_gather+copy-in": ag_fsdp2,
                    "reduce_scatter": rs_bare, "reduce_scatter fresh buffers": rs_fresh_buffers,
                    "reduce_scatter+chunk_cat+div": rs_fsdp2}
        times = {k: [] for k in variants}
        for it in range(35):
            for k, f in variants.items():
                dist.barrier()
                t = time.perf_counter()
                f()
                if it >= 5:
                    times[k].append((time.perf_counter() - t) * 1e6)
        shortest = {}
        for k, v in times.items():
            mine = torch.tensor(v, dtype=torch.float64)
            every = [torch.empty_like(mine) for _ in range(w)]
            dist.all_gather(every, mine)
            shortest[k] = st.median(torch.stack(every).min(0).values.tolist())
        if r == 0:
            parts = []
            for k, us in shortest.items():
                base = shortest["all_gather" if k.startswith("all_gather") else "reduce_scatter"]
                parts.append(f"{k} {us:.0f} us ({us / base:.2f}x)")
            print(f"{size} B: " + ", ".join(parts), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
