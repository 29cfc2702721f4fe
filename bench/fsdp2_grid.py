"""A grid of real FSDP2 runs (fully_shard, gloo, 2 ranks, CPU), measured and predicted.

    PY bench/fsdp2_grid.py run --out DIR --fsdplab BIN [--quick] [--only REGEX] [--steps N]
    PY bench/fsdp2_grid.py regrade DIR --fsdplab BIN
    PY bench/fsdp2_grid.py spread --out DIR [--config RUN_ID] [--steps N]

Models this project did not write, built from their libraries' code with random weights: HF
`transformers` Llama and GPT-2 from config objects (HF_HUB_OFFLINE=1, nothing downloaded) and an
embedding + torch.nn.TransformerEncoder + head; two sizes each. Each block is wrapped with
`checkpoint_wrapper` (non-reentrant, as torchtitan does) when activation checkpointing is on,
then `fully_shard` per block and on the root; AdamW; one or two microbatches (gradient
accumulation, FSDP2's default reduce-scatter per microbatch). The design (which factors vary on
which runs) is DESIGN below.

Each run is five kinds of process pair, one after the other, so nothing attached slows the timed
steps: `timed` (nothing attached; warm-up, then steps timed from a barrier to after
opt.zero_grad(), with the forward+backward, optimizer step and zero_grad split; twice, first and
last, so the drift between two runs of the same configuration shows), `record` (the recorder,
Recorder(model, optimizer=opt), a trace per rank; an unrecorded step timed after each recorded
one, so the prediction also meets the run it was recorded in), `profile` (torch.profiler,
record_shapes, a Chrome trace per rank for `fsdplab import-kineto`; the profiled steps are also
recorded, into profile/recorded/, so the recorder and the import are compared on the same steps),
`stack` (the same with with_stack=True, into stack/: the import places FSDP2's hook Python and
the recorder's own time by their Python frames, so the two meet on one definition there; both
profile phases time three unprofiled steps before and after the profile, so the profiler's cost
estimate is also judged against its own process pair) and `mem`
(FSDPMemTracker over the step's last microbatch, the optimizer step and zero_grad: the tracker
refuses a module called twice in one tracked region, and the last microbatch holds the earlier
ones' gradients); a policy run adds `paired` (a second model with FSDP2's defaults in the same
processes, timed steps alternating between the two: the policy's change free of the
pair-to-pair noise). Every rank is pinned
to its own core (its threads, gloo's included, inherit it), with one intra-op and one inter-op
thread; `spread` measures what each of those measures does to the spread of the step times.

Then the predictions, through the command line as a user would (grade; `regrade DIR` redoes
them with the current build from the kept raw files): `simulate --rank-trace traces/ --preset
fsdp2`, `import-kineto ... --out-dir` + `simulate` on the imported traces, `import-kineto
--check`; policy runs apply the policy that `tune --preset fsdp2` gave on the base run's trace,
exported with `export-policy --to fsdp2 --format json`. The table compares per run and as
medians and p90s: step time, exposed communication and peak memory, measured against both
predictions, with the spread beside them; the step error split into compute, exposed
communication and idle; the peak by category against FSDPMemTracker's; the recorder's and the
importer's compute per unit and phase, without and with the Python frames; and for each policy
run the measured against predicted
change. Everything lands in DIR (summary.json, table.txt, runs/RUN_ID/...).
"""

import argparse
import contextlib
import glob
import gzip
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.join(HERE, "..", "python")  # the fsdplab package (fsdplab.torch)
WORLD = 2

# -------------------------------------------------------------------------------------------------
# The grid's design.

# Model sizes: (d_model, layers, heads, vocab, batch, seq). "xs" is the CI size.
SIZES = {
    "xs": (64, 2, 4, 512, 2, 32),
    "s": (128, 4, 4, 2048, 4, 64),
    "l": (256, 6, 8, 4096, 4, 64),
}
MODELS = ("llama", "gpt2", "encoder")


def config(model, size, ac=False, mb=1, reshard=True, policy="default"):
    return {"model": model, "size": size, "ac": bool(ac), "mb": int(mb), "reshard": bool(reshard),
            "policy": policy}


def run_id(c):
    return (f"{c['model']}-{c['size']}-ac{int(c['ac'])}-mb{c['mb']}-rs{int(c['reshard'])}-"
            f"{c['policy']}")


def base_of(c):
    """The run a policy run's policy is tuned on: the same configuration with FSDP2's defaults."""
    return run_id(dict(c, policy="default"))


def design(quick):
    """Every model x size with activation checkpointing off and on and one and two microbatches
    (FSDP2's defaults); reshard_after_forward false and the exported policy on every model's
    small size, one microbatch, no checkpointing (30 runs). --quick: the encoder at the CI size,
    two configurations (plain; checkpointing with two microbatches)."""
    if quick:
        return [config("encoder", "xs"), config("encoder", "xs", ac=True, mb=2)]
    runs = []
    for model in MODELS:
        for size in ("s", "l"):
            for ac in (False, True):
                for mb in (1, 2):
                    runs.append(config(model, size, ac, mb))
    for model in MODELS:
        runs.append(config(model, "s", reshard=False))
    for model in MODELS:
        runs.append(config(model, "s", policy="exported"))
    return runs


# Isolation levels of the timed processes (what `spread` compares; the grid uses "pinned").
ISOLATION = ("none", "threads", "pinned", "pinned-gc", "pinned-main")


# -------------------------------------------------------------------------------------------------
# One rank of one phase (a separate process).


def pin(rank, isolation):
    """Before torch is imported: one intra-op / inter-op thread (threads, pinned*), and the rank
    on its own core (pinned*); every thread started later (torch's, gloo's) inherits it."""
    if isolation == "none":
        return None
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"
    if isolation in ("pinned", "pinned-gc"):
        cores = sorted(os.sched_getaffinity(0))
        core = cores[rank % len(cores)]
        os.sched_setaffinity(0, {core})
        return core
    return None


def build_model(c, torch, nn):
    d, layers, heads, vocab, _, seq = SIZES[c["size"]]
    torch.manual_seed(0)
    if c["model"] in ("llama", "gpt2"):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import transformers

        transformers.logging.set_verbosity_error()
        if c["model"] == "llama":
            cfg = transformers.LlamaConfig(
                vocab_size=vocab, hidden_size=d, intermediate_size=int(8 * d / 3 + 63) // 64 * 64,
                num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                max_position_embeddings=seq, bos_token_id=0, eos_token_id=1, pad_token_id=None,
            )
            model = transformers.LlamaForCausalLM(cfg)
            blocks = model.model.layers
        else:
            cfg = transformers.GPT2Config(
                vocab_size=vocab, n_embd=d, n_layer=layers, n_head=heads, n_positions=seq,
                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=1,
            )
            model = transformers.GPT2LMHeadModel(cfg)
            blocks = model.transformer.h

        def loss_fn(ids):
            return model(input_ids=ids, labels=ids).loss

    else:

        class EncoderLm(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(vocab, d)
                layer = nn.TransformerEncoderLayer(
                    d, nhead=heads, dim_feedforward=4 * d, dropout=0.0, batch_first=True
                )
                self.encoder = nn.TransformerEncoder(layer, num_layers=layers,
                                                     enable_nested_tensor=False)
                self.head = nn.Linear(d, vocab)

            def forward(self, ids):
                return self.head(self.encoder(self.embed(ids)))

        model = EncoderLm()
        blocks = model.encoder.layers

        def loss_fn(ids):
            logits = model(ids)
            return nn.functional.cross_entropy(logits.reshape(-1, vocab), ids.reshape(-1))

    return model, blocks, loss_fn


def shard(c, model, blocks):
    """checkpoint_wrapper per block (AC on), fully_shard per block, then the root: torchtitan's
    order. reshard false: every module keeps its parameters after forward."""
    from torch.distributed.fsdp import fully_shard

    if c["ac"]:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            CheckpointImpl,
            checkpoint_wrapper,
        )

        for i in range(len(blocks)):
            blocks[i] = checkpoint_wrapper(
                blocks[i], checkpoint_impl=CheckpointImpl.NO_REENTRANT, preserve_rng_state=False
            )
    # FSDP2's default is no argument: blocks reshard after forward, the root does not (passing
    # True would make the root reshard too).
    kwargs = {} if c["reshard"] else {"reshard_after_forward": False}
    for block in blocks:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)


def bench_collectives(torch, dist, model, iters=8):
    """After the timed steps: FSDP2's collectives alone, at this model's sizes (each FSDP
    module's padded fp32 parameters), one call at a time after a barrier, as a bench measures
    them: {kind: {bytes: median us}} (bytes: the all-gather's output, the reduce-scatter's input).
    """
    sizes = set()
    for m in model.modules():
        if "FSDPModule" not in {c.__name__ for c in type(m).__mro__}:
            continue
        state = m._get_fsdp_state()
        for group in getattr(state, "_fsdp_param_groups", None) or [state._fsdp_param_group]:
            if group is None:
                continue
            n = sum(p.padded_sharded_param_size.numel() for p in group.fsdp_params)
            sizes.add(n)
    out = {"all_gather": {}, "reduce_scatter": {}}
    for n in sorted(sizes):
        shard, full = torch.ones(n), torch.empty(n * WORLD)
        part, grads = torch.empty(n), torch.ones(n * WORLD)
        for kind, op in (("all_gather", lambda: dist.all_gather_into_tensor(full, shard)),
                         ("reduce_scatter", lambda: dist.reduce_scatter_tensor(part, grads))):
            times = []
            for i in range(2 + iters):
                dist.barrier()
                t0 = time.perf_counter()
                op()
                if i >= 2:
                    times.append((time.perf_counter() - t0) * 1e6)
            out[kind][str(n * WORLD * 4)] = statistics.median(times)
    return out


def grad_aware_tracker(torch, model):
    """FSDPMemTracker, which also notes at its peak the bytes of parameter gradients it counts
    as "Temp": the tracker names a tensor by where it was made, and a unit's unsharded gradients
    are made in the backward (Temp) and become "Unsharded Grad" only at FSDP's post_backward,
    which frees them at once; the root's head gradients stay Temp through its layers' backward.
    At each new peak this finds them (the unsharded parameters' .grad) among the tracked
    storages, so that the grid can compare gradients with gradients."""
    from torch.distributed._tools.common_utils import get_untyped_storages
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPRefType

    fsdp_params = []
    for m in model.modules():
        if "FSDPModule" not in {c.__name__ for c in type(m).__mro__}:
            continue
        state = m._get_fsdp_state()
        for group in getattr(state, "_fsdp_param_groups", None) or [state._fsdp_param_group]:
            if group is not None:
                fsdp_params.extend(group.fsdp_params)

    class Tracker(FSDPMemTracker):
        grads_in_temp = 0

        def _update_peak_stats(self, peak_state):
            before = dict(self._peak_mem)
            super()._update_peak_stats(peak_state)
            if any(v > before.get(d, 0) for d, v in self._peak_mem.items()):
                self.grads_in_temp = self._temp_grads()

        def _temp_grads(self):
            total, seen = 0, set()
            for fp in fsdp_params:
                g = getattr(getattr(fp, "_unsharded_param", None), "grad", None)
                if g is None:
                    continue
                for st in get_untyped_storages(g):
                    winfo, _ = self._WINFO.get(st, (None, None))
                    if winfo is None or id(winfo) in seen:
                        continue
                    seen.add(id(winfo))
                    if winfo.reftype == _FSDPRefType.TEMP:
                        total += winfo.mem_consumed
            return total

    return Tracker


def rank_main(args):
    c = json.loads(args.config)
    core = pin(args.rank, args.isolation)
    import gc

    import torch
    import torch.distributed as dist
    import torch.nn as nn

    sys.path.insert(0, PYTHON_DIR)
    if args.isolation != "none":
        torch.set_num_threads(1)
        torch.set_num_interop_threads(1)
    store = os.path.join(args.dir, f".store.{args.phase}")
    dist.init_process_group("gloo", init_method="file://" + store, rank=args.rank,
                            world_size=WORLD)
    if args.isolation == "pinned-main":
        # Only the Python thread (torch's intra-op work runs on it with one thread): gloo's
        # threads, started by init_process_group, stay free to run on either core.
        cores = sorted(os.sched_getaffinity(0))
        core = cores[args.rank % len(cores)]
        os.sched_setaffinity(0, {core})
    model, blocks, loss_fn = build_model(c, torch, nn)
    shard(c, model, blocks)
    notes = []
    if c["policy"] != "default":
        from fsdplab.torch import apply_policy

        notes = apply_policy(model, os.path.join(args.dir, "policy", "fsdp2.json"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    _, _, _, vocab, batch, seq = SIZES[c["size"]]
    gen = torch.Generator().manual_seed(1000 + args.rank)  # each rank its own data
    mbs = [torch.randint(0, vocab, (batch, seq), generator=gen) for _ in range(c["mb"])]

    def fwd_bwd(batches):
        for ids in batches:
            loss_fn(ids).backward()

    def step():
        fwd_bwd(mbs)
        opt.step()
        opt.zero_grad()

    out = {"phase": args.phase, "rank": args.rank, "torch": torch.__version__,
           "isolation": args.isolation, "core": core, "threads": torch.get_num_threads(),
           "interop_threads": torch.get_num_interop_threads(), "notes": notes}
    gc_each = args.isolation == "pinned-gc"

    def timer(loss, optimizer):
        """One step of (loss, optimizer) timed from a barrier: total, forward+backward, optimizer
        step and zero_grad (us)."""
        def timed():
            if gc_each:
                gc.collect()
            dist.barrier()
            t0 = time.perf_counter()
            for ids in mbs:
                loss(ids).backward()
            t1 = time.perf_counter()
            optimizer.step()
            t2 = time.perf_counter()
            optimizer.zero_grad()
            t3 = time.perf_counter()
            return [(t3 - t0) * 1e6, (t1 - t0) * 1e6, (t2 - t1) * 1e6, (t3 - t2) * 1e6]

        return timed

    timed_step = timer(loss_fn, opt)

    if args.phase == "paired":
        # This run's policy against FSDP2's defaults in one process pair: a second model built
        # the same way (same seed) with the defaults, each timed step alternating between the
        # two, so the pair's speed and the machine's drift fall on both alike.
        default = dict(c, policy="default")
        base, base_blocks, base_loss = build_model(default, torch, nn)
        shard(default, base, base_blocks)
        base_step = timer(base_loss, torch.optim.AdamW(base.parameters(), lr=1e-4))
        for _ in range(args.warmup):
            base_step()
            timed_step()
        rows = [(base_step()[0], timed_step()[0]) for _ in range(args.steps)]
        out["default_us"], out["policy_us"] = map(list, zip(*rows))
    elif args.phase.startswith("timed"):
        for _ in range(args.warmup):
            timed_step()
        if gc_each:
            gc.freeze()
        rows = [timed_step() for _ in range(args.steps)]
        out["step_us"], out["fwd_bwd_us"], out["opt_us"], out["zero_grad_us"] = map(
            list, zip(*rows)
        )
        if args.bench:
            out["bench"] = bench_collectives(torch, dist, model)
    elif args.phase == "record":
        from fsdplab.torch import Recorder

        for _ in range(args.warmup):
            step()
        rec = Recorder(model, optimizer=opt)
        spans = []
        between = []
        for _ in range(args.record_steps):
            dist.barrier()
            t0 = time.perf_counter()
            with rec.step():
                fwd_bwd(mbs)
                opt.step()
                opt.zero_grad()
            spans.append((time.perf_counter() - t0) * 1e6)
            # An unrecorded step after each recorded one, timed as the timed phases time theirs:
            # the recorder's hooks exist only inside rec.step(), so this is the run with nothing
            # attached, in the same process pair as the trace.
            between.append(timed_step()[0])
        rec.remove()
        os.makedirs(os.path.join(args.dir, "traces"), exist_ok=True)
        rec.save(os.path.join(args.dir, "traces", "trace.json"))
        out["step_us"] = spans
        out["between_us"] = between
        out["overhead"] = rec.overhead()
    elif args.phase in ("profile", "stack"):
        from torch.profiler import ProfilerActivity, profile, schedule

        from fsdplab.torch import Recorder

        step()  # FSDP's lazy initialisation, outside the profile
        spans = []
        n = args.profile_steps if args.phase == "profile" else args.stack_steps
        # Unprofiled steps in the same process pair, before and after the profile, timed as the
        # timed phases time theirs: the profiler's cost estimate judged free of the pair-to-pair
        # noise.
        unprofiled = [timed_step()[0] for _ in range(3)]
        sched = schedule(wait=1, warmup=1, active=n, repeat=1)
        # The profiled steps are also recorded (PHASE/recorded/): the recorder and the import
        # compared on the same steps. memory_steps=0: the recorder's memory probe is a dispatch
        # mode, under which the profiler would see every operator twice.
        rec = Recorder(model, optimizer=opt, memory_steps=0)
        # profile_memory: the allocations and frees import-kineto attributes to each compute.
        # `stack` takes the Python frames too (with_stack): the import gives FSDP2's frames to
        # FSDP and leaves the recorder's own out, so the two meet on one definition there. The
        # Python tracer slows every call, so the step and memory are graded on `profile`'s.
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True,
                     with_stack=args.phase == "stack", schedule=sched) as prof:
            for i in range(2 + n):
                dist.barrier()
                t0 = time.perf_counter()
                with rec.step() if i >= 2 else contextlib.nullcontext():
                    step()
                spans.append((time.perf_counter() - t0) * 1e6)
                prof.step()
        rec.remove()
        unprofiled += [timed_step()[0] for _ in range(3)]
        out["unprofiled_step_us"] = unprofiled
        os.makedirs(os.path.join(args.dir, args.phase, "recorded"), exist_ok=True)
        prof.export_chrome_trace(
            os.path.join(args.dir, args.phase, f"trace.rank{args.rank}.json.gz")
        )
        rec.save(os.path.join(args.dir, args.phase, "recorded", "trace.json"))
        out["step_us"] = spans[2:]  # the profiled (active) steps
    elif args.phase == "mem":
        tracker_class = grad_aware_tracker(torch, model)

        step()  # lazy initialisation; the optimizer's state exists from here on
        step()
        dist.barrier()
        fwd_bwd(mbs[:-1])  # earlier microbatches untracked: their gradients are held
        tracker = tracker_class(model, opt)
        tracker.track_inputs((mbs[-1],))
        with tracker:
            fwd_bwd(mbs[-1:])
            opt.step()
            opt.zero_grad()
        snap = tracker.get_tracker_snapshot("peak")
        out["peak"] = {str(dev): {getattr(k, "value", k): int(v) for k, v in cats.items()}
                       for dev, cats in snap.items()}
        # Where in the step the peak came: the root's forward and backward peaks.
        root_stats = tracker.memory_tracking.get(model)
        phases = {}
        if root_stats is not None:
            for state, snaps in root_stats.snapshots.items():
                name = getattr(state, "value", str(state))
                if "Peak" in name and snaps:
                    phases[name] = {
                        str(dev): {getattr(k, "value", k): int(v) for k, v in cats.items()}
                        for dev, cats in snaps[-1].items()
                    }
        out["peak_by_phase"] = phases
        # Of the peak's "Temp", the parameter gradients being produced (see grad_aware_tracker).
        out["grads_in_temp"] = tracker.grads_in_temp
        out["sharded_param_bytes"] = sum(
            p.to_local().numel() * p.element_size() for p in model.parameters()
        )
    else:
        raise SystemExit(f"fsdp2_grid: unknown phase {args.phase!r}")
    with open(os.path.join(args.dir, f"{args.phase}.rank{args.rank}.json"), "w",
              encoding="utf-8") as f:
        json.dump(out, f, indent=1)
    dist.destroy_process_group()


# -------------------------------------------------------------------------------------------------
# Running the grid.


def run_phase(rundir, c, phase, args, isolation="pinned", bench=False):
    """Both ranks of one phase; a failed rank fails the grid loudly (with its stderr)."""
    store = os.path.join(rundir, f".store.{phase}")
    if os.path.exists(store):
        os.unlink(store)
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONDONTWRITEBYTECODE="1")
    procs = []
    for r in range(WORLD):
        cmd = [sys.executable, os.path.abspath(__file__), "rank", "--rank", str(r), "--phase",
               phase, "--dir", rundir, "--config", json.dumps(c), "--isolation", isolation,
               "--steps", str(args.steps), "--warmup", str(args.warmup), "--record-steps",
               str(args.record_steps), "--profile-steps", str(args.profile_steps),
               "--stack-steps", str(args.stack_steps)]
        cmd += ["--bench"] if bench else []
        log = open(os.path.join(rundir, f"{phase}.rank{r}.log"), "w", encoding="utf-8")
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log))
    rcs = []
    for p, log in procs:
        try:
            rcs.append(p.wait(timeout=900))
        except subprocess.TimeoutExpired:
            p.kill()
            rcs.append(p.wait())
        log.close()
    if os.path.exists(store):
        os.unlink(store)
    if any(rcs):
        tails = []
        for r in range(WORLD):
            with open(os.path.join(rundir, f"{phase}.rank{r}.log"), encoding="utf-8") as f:
                tails.append(f"rank {r}:\n" + f.read()[-3000:])
        raise SystemExit(f"fsdp2_grid: {os.path.basename(rundir)} {phase} failed ({rcs})\n"
                         + "\n".join(tails))


def rerun_phases(args, c, rundir):
    """--phases: runs those phases again in a complete run's folder, keeping the others' files
    (after a change to the recorder, the profiler's options or the memory measurement: the
    timed phases stay as they were)."""
    done_path = os.path.join(rundir, "done")
    if not os.path.exists(done_path):
        raise SystemExit(f"fsdp2_grid: --phases: {run_id(c)} has no complete run in {rundir}")
    done = load(done_path)
    t0 = time.time()
    for phase in args.phases.split(","):
        if phase not in ("record", "profile", "stack", "mem", "paired"):
            raise SystemExit(f"fsdp2_grid: --phases: {phase!r} is not record, profile, stack, "
                             "mem or paired")
        if phase == "paired" and c["policy"] == "default":
            continue  # only a policy run has a policy to pair with the defaults
        for sub in {"record": ["traces"], "profile": ["profile"], "stack": ["stack"], "mem": [],
                    "paired": []}[phase]:
            shutil.rmtree(os.path.join(rundir, sub), ignore_errors=True)
        with OthersLoad() as o:
            run_phase(rundir, c, phase, args)
        done.setdefault("others_cpu", {})[phase] = round(o.fraction, 4)
        done.setdefault("rerun", {})[phase] = time.strftime("%Y-%m-%d %H:%M:%S")
    with open(done_path, "w", encoding="utf-8") as f:
        json.dump(done, f)
    print(f"{run_id(c)}: {args.phases} again in {time.time() - t0:.0f} s", flush=True)


def fsdplab(bin_, *argv, check=True):
    p = subprocess.run([bin_, *argv], capture_output=True, text=True, timeout=600)
    if check and p.returncode not in (0, 3):
        raise SystemExit(f"fsdp2_grid: fsdplab {' '.join(argv)} failed ({p.returncode}):\n"
                         f"{p.stderr[-3000:]}")
    return p


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def cpu_busy_s():
    """The machine's busy CPU seconds so far (all cores; /proc/stat) and its children's (this
    grid's ranks, once waited for)."""
    import resource

    with open("/proc/stat", encoding="utf-8") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    tick = os.sysconf("SC_CLK_TCK")
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (sum(fields[:8]) - idle) / tick, ru.ru_utime + ru.ru_stime


class OthersLoad:
    """What other processes used of the machine's cores while a block ran: (busy - this grid's
    children) / (wall x cores)."""

    def __enter__(self):
        self.t0 = time.time()
        self.busy0, self.mine0 = cpu_busy_s()
        return self

    def __exit__(self, *exc):
        busy, mine = cpu_busy_s()
        wall = time.time() - self.t0
        cores = os.cpu_count() or 1
        self.fraction = max(0.0, ((busy - self.busy0) - (mine - self.mine0)) / (wall * cores))


def wait_idle(max_wait_s, threshold=0.25, sample_s=3.0):
    """Waits until other processes use less than `threshold` of the cores over `sample_s`, or
    `max_wait_s` passed; returns (waited seconds, the last sample's fraction)."""
    t0 = time.time()
    while True:
        with OthersLoad() as o:
            time.sleep(sample_s)
        if o.fraction < threshold or time.time() - t0 >= max_wait_s:
            return time.time() - t0, o.fraction
        time.sleep(10)


def machine_load():
    with open("/proc/loadavg", encoding="utf-8") as f:
        return [float(x) for x in f.read().split()[:3]]


# The policy applied when tune finds nothing better than FSDP2's defaults (its predicted gain
# under 1%): explicit prefetch lists two units ahead in both passes, through the same
# export-policy -> apply_policy path. Only prefetch keys: the trace's meta keeps its optimizer.
HAND_POLICY = {"order": "recorded", "forward_prefetch": "2", "backward_prefetch": "2"}


def export_policy(args, rundir, base_dir):
    """`tune --preset fsdp2` on the base run's recorded trace (rank 0's: tune reads one), exported
    for FSDP2 as JSON; the hand policy instead when tune predicts under 1% against FSDP2's
    defaults. policy/source.json says which, with tune's prediction."""
    pol = os.path.join(rundir, "policy")
    os.makedirs(pol, exist_ok=True)
    trace = os.path.join(base_dir, "traces", "trace.rank0.json")
    tuned = os.path.join(pol, "tuned.json")
    # The cap is far above what these models need on the CPU.
    p = fsdplab(args.fsdplab, "tune", trace, "--memory-cap", "16G", "--preset", "fsdp2", "--out",
                tuned)
    with open(os.path.join(pol, "tune.txt"), "w", encoding="utf-8") as f:
        f.write(p.stdout + p.stderr)
    m = re.search(r"FSDP2 default: ([0-9.]+) ms; tuned: ([0-9.]+) ms", p.stdout)
    gain = (float(m.group(2)) - float(m.group(1))) / float(m.group(1)) if m else None
    source = {"tune_predicted_change": gain, "policy": "tune"}
    applied = tuned
    if gain is None or abs(gain) < 0.01:
        applied = os.path.join(pol, "hand.json")
        with open(applied, "w", encoding="utf-8") as f:
            json.dump(HAND_POLICY, f, indent=1)
        source["policy"] = "hand"
    with open(os.path.join(pol, "source.json"), "w", encoding="utf-8") as f:
        json.dump(source, f, indent=1)
    fsdplab(args.fsdplab, "export-policy", applied, "--trace", trace, "--to", "fsdp2", "--format",
            "json", "-o", os.path.join(pol, "fsdp2.json"))


def policy_file(rundir):
    """The fsdplab policy a policy run applied (tune's, or the hand policy)."""
    source = load(os.path.join(rundir, "policy", "source.json"))
    return os.path.join(rundir, "policy",
                        "tuned.json" if source["policy"] == "tune" else "hand.json")


def run(args):
    os.makedirs(args.out, exist_ok=True)
    runs = design(args.quick)
    if args.only:
        runs = [c for c in runs if re.search(args.only, run_id(c))]
    env = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "load_before": machine_load(),
           "cores": sorted(os.sched_getaffinity(0)), "quick": args.quick, "steps": args.steps,
           "warmup": args.warmup, "record_steps": args.record_steps,
           "profile_steps": args.profile_steps, "stack_steps": args.stack_steps,
           "repeats": args.repeats,
           "python": sys.executable, "design": design.__doc__.strip(),
           "fsdplab": args.fsdplab, "commit": subprocess.run(
               ["git", "-C", HERE, "describe", "--always", "--dirty"], capture_output=True,
               text=True).stdout.strip()}
    t_start = time.time()
    # Policy runs last: their policy is tuned on their base run's trace.
    runs.sort(key=lambda c: c["policy"] != "default")
    for c in runs:
        rid = run_id(c)
        rundir = os.path.join(args.out, "runs", rid)
        if args.phases:
            rerun_phases(args, c, rundir)
            continue
        if os.path.exists(os.path.join(rundir, "done")) and not args.force:
            print(f"{rid}: kept", flush=True)
            continue
        shutil.rmtree(rundir, ignore_errors=True)
        os.makedirs(rundir)
        with open(os.path.join(rundir, "config.json"), "w", encoding="utf-8") as f:
            json.dump(c, f, indent=1)
        waited, idle_sample = wait_idle(args.wait_idle) if args.wait_idle else (0.0, None)
        t0 = time.time()
        load_before = machine_load()
        if c["policy"] != "default":
            export_policy(args, rundir, os.path.join(args.out, "runs", base_of(c)))
        phases = ["timed0", "record", "profile", "stack", "mem"]
        if args.repeats > 1:
            phases.append("timed1")
        if c["policy"] != "default":
            phases.append("paired")
        last_timed = [p for p in phases if p.startswith("timed")][-1]
        others = {}
        for phase in phases:
            with OthersLoad() as o:
                run_phase(rundir, c, phase, args, bench=phase == last_timed)
            others[phase] = round(o.fraction, 4)
        with open(os.path.join(rundir, "done"), "w", encoding="utf-8") as f:
            json.dump({"wall_s": round(time.time() - t0, 1), "load_before": load_before,
                       "load_after": machine_load(), "waited_for_idle_s": round(waited, 1),
                       "others_before": idle_sample, "others_cpu": others}, f)
        print(f"{rid}: {time.time() - t0:.0f} s (waited {waited:.0f} s; other processes used "
              f"{100 * max(others.values()):.0f}% of the cores at most)", flush=True)
    env["wall_s"] = round(time.time() - t_start, 1)
    env["load_after"] = machine_load()
    with open(os.path.join(args.out, "grid.json"), "w", encoding="utf-8") as f:
        json.dump(env, f, indent=1)
    grade(args.out, args.fsdplab)


# -------------------------------------------------------------------------------------------------
# Grading: predictions through the CLI and the comparison, from the kept raw files.


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


def pct(x, q):
    xs = sorted(x)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def spread_of(xs):
    """(max - min) / median and p90 / p50 of a list of step times."""
    med = statistics.median(xs)
    return {"median": med, "p90": pct(xs, 0.9), "min": min(xs), "max": max(xs), "n": len(xs),
            "range_rel": (max(xs) - min(xs)) / med, "p90_p50": pct(xs, 0.9) / med}


def per_step_max(rundir, phase, key="step_us"):
    ranks = [load(os.path.join(rundir, f"{phase}.rank{r}.json")) for r in range(WORLD)]
    return [max(v) for v in zip(*(r[key] for r in ranks))]


def unprofiled_pair_us(rundir, phase):
    """The median of the unprofiled steps a profile phase timed in its own process pair (the
    slower rank's each); None for a grid whose phase did not time them."""
    try:
        return statistics.median(per_step_max(rundir, phase, "unprofiled_step_us"))
    except KeyError:
        return None


def trace_steps(trace):
    """Per recorded step: (span, time inside collectives, compute) of one rank's trace."""
    rows = []
    for step in trace["steps"]:
        events = [e for mb in step["microbatches"] for e in mb["events"]]
        starts = [e["ts_us"] for e in events if "ts_us" in e]
        starts += [e["start_us"] for e in events if e["op"] == "collective"]
        ends = [e.get("ts_us", 0.0) + e.get("us", 0.0) for e in events]
        ends += [e["end_us"] for e in events if e["op"] == "collective"]
        coll = [(e["start_us"], e["end_us"]) for e in events if e["op"] == "collective"]
        rows.append({"span_us": max(ends) - min(starts), "comm_us": union_length(coll),
                     "compute_us": sum(e["us"] for e in events if e["op"] == "compute")})
    return rows


def agreement(recorded, imported):
    """Per unit and phase: the recorder's compute (recorded: a trace file) against the import's
    (imported: the imported trace of the same rank), medians over the steps after the first.
    On the same steps (as many on both sides) the ratio is the median of each step's ratio, so
    one step where the two place a stall differently moves neither side's median to another
    step; else the ratio of the medians."""
    rec_steps, imp_steps = unit_compute_steps(load(recorded)), unit_compute_steps(load(imported))
    rows = []
    for key in sorted(set(rec_steps) | set(imp_steps)):
        r, i = rec_steps.get(key), imp_steps.get(key)
        r_med = statistics.median(r.values()) if r else None
        i_med = statistics.median(i.values()) if i else None
        if r and i and r.keys() == i.keys() and all(r.values()):
            ratio = statistics.median(i[s] / r[s] for s in r)
        else:
            ratio = (i_med / r_med) if r_med and i_med is not None else None
        rows.append({"unit": key[0], "phase": key[1], "recorder_us": r_med, "imported_us": i_med,
                     "ratio": ratio})
    return rows


def unit_compute_steps(trace):
    """(unit, phase) -> {step index: summed compute} over the steps after the first (rank's
    trace; a one-step trace: that step). The first recorded step is the recorder's costliest:
    it hooks every parameter to learn which gradient comes last, Python the recorder leaves out
    of its marks and a profile of the same step shows inside the units (the simulator's step
    time leaves that step out too)."""
    per = {}
    steps = trace["steps"]
    for i, step in enumerate(steps):
        if i == 0 and len(steps) > 1:
            continue
        for mb in step["microbatches"]:
            for e in mb["events"]:
                if e["op"] == "compute" and e.get("unit"):
                    key = (e["unit"], e["phase"])
                    per.setdefault(key, {}).setdefault(i, 0.0)
                    per[key][i] += e["us"]
    return per


def rec_rows_raw(traces):
    return [load(os.path.join(traces, f"trace.rank{r}.json")) for r in range(WORLD)]


def fsdp_work(trace):
    """Per recorded step, the unit-less compute: FSDP2's own work outside its collectives
    (copy-in and copy-out around the all-gathers, the reduce-scatter's copies) and the loss."""
    return [sum(e["us"] for mb in st["microbatches"] for e in mb["events"]
                if e["op"] == "compute" and not e.get("unit")) for st in trace["steps"]]


def collectives_vs_bench(rundir, traces):
    """The recorded collectives (each the shorter of the two ranks' spans, so that the rank that
    arrived last, which barely waits, gives it) against the same sizes benched alone after the
    timed steps: per kind, the sum of both and their ratio."""
    bench = None
    for p in ("timed1", "timed0"):
        path = os.path.join(rundir, f"{p}.rank0.json")
        if os.path.exists(path) and "bench" in load(path):
            bench = load(path)["bench"]
            break
    if bench is None:
        return None
    per_rank = []
    for t in traces:
        per_rank.append([(e["kind"], e["bytes"], e["end_us"] - e["start_us"])
                         for st in t["steps"] for mb in st["microbatches"] for e in mb["events"]
                         if e["op"] == "collective"])
    out = {}
    for kind in ("all_gather", "reduce_scatter"):
        step_us = bench_us = 0.0
        n = 0
        for a, b in zip(*per_rank):
            if a[0] != kind or a[:2] != b[:2] or str(a[1]) not in bench[kind]:
                continue
            step_us += min(a[2], b[2])
            bench_us += bench[kind][str(a[1])]
            n += 1
        if n:
            out[kind] = {"count": n, "in_step_us": step_us, "bench_us": bench_us,
                         "ratio": step_us / bench_us}
    return out


# FSDPMemTracker's categories against the simulator's (report peak_memory_by_category). The
# tracker names a tensor by where it was made: an all-gather's output before FSDP copies it out
# is "All Gather" (the plan counts the gathered parameters from the gather's start), and the
# parameter gradients being produced in the backward are "Temp" until FSDP's post_backward
# ("Grads in Temp", measured at the tracker's peak by the mem phase: grad_aware_tracker), so
# those go with parameters and gradients. "-" before a tracker category subtracts it.
MEM_GROUPS = [
    ("sharded params", ["Sharded Param"], ["sharded_params", "master_params"]),
    ("unsharded params", ["Unsharded Param", "All Gather"], ["unsharded_params"]),
    ("grads", ["Sharded Grad", "Unsharded Grad", "Grads in Temp"],
     ["sharded_grads", "unsharded_grads", "grad_accumulation"]),
    ("activations", ["Activation"], ["activations"]),
    ("temporaries", ["Temp", "-Grads in Temp"], ["temporaries"]),
    ("optimizer state", ["OptState"], ["optimizer_state"]),
    ("reduce-scatter buffers", ["Reduce Scatter"], ["reduce_scatter_buffers"]),
    ("inputs and buffers", ["Inputs", "Buffer"], []),
]
# The Done-when groups: parameters, gradients and optimizer state within 1% at the peak.
EXACT_GROUPS = {"params": ["sharded params", "unsharded params"], "grads": ["grads"],
                "opt": ["optimizer state"]}


def tracker_sum(cats, keys):
    return sum(-cats.get(k[1:], 0) if k.startswith("-") else cats.get(k, 0) for k in keys)


def tracker_peak(rundir):
    """The larger of the two ranks' tracked peaks: its categories, where it came, and the
    parameter gradients inside its Temp (grad_aware_tracker)."""
    best = None
    for r in range(WORLD):
        m = load(os.path.join(rundir, f"mem.rank{r}.json"))
        for cats in m["peak"].values():
            if best is None or cats["Total"] > best[0]["Total"]:
                best = (cats, m)
    cats, m = best
    phase = None
    for name, snap in m.get("peak_by_phase", {}).items():
        for dcats in snap.values():
            if dcats.get("Total") == cats["Total"]:
                phase = name
    return cats, phase, m.get("grads_in_temp", 0)


def simulate(bin_, traces, out, extra=()):
    p = fsdplab(bin_, "simulate", "--rank-trace", traces, "--preset", "fsdp2", "--json", *extra)
    with open(out, "w", encoding="utf-8") as f:
        f.write(p.stdout)
    return json.loads(p.stdout)


def predicted(report):
    s = report["summary"]
    steps = report["steps"][1:] or report["steps"]
    compute = statistics.mean(st["compute_us"] for st in steps)
    return {"step_us": s["step_time_us"], "exposed_comm_us": s["exposed_comm_us"],
            "compute_us": compute,
            "idle_us": s["step_time_us"] - compute - s["exposed_comm_us"],
            "peak_bytes": s["peak_memory_bytes"],
            "peak_by_category": s.get("peak_memory_by_category", {}),
            "warnings": report.get("warnings", [])}


def grade_run(rundir, bin_, base_pred=None):
    c = load(os.path.join(rundir, "config.json"))
    pred_dir = os.path.join(rundir, "pred")
    shutil.rmtree(pred_dir, ignore_errors=True)
    os.makedirs(pred_dir)
    traces = os.path.join(rundir, "traces")
    policy_flags = []
    if c["policy"] != "default":
        policy_flags = ["--policy", policy_file(rundir)]
    rec_report = simulate(bin_, traces, os.path.join(pred_dir, "recorder.report.json"),
                          policy_flags)
    profiles = sorted(glob.glob(os.path.join(rundir, "profile", "trace.rank*.json.gz")))
    imported = os.path.join(pred_dir, "imported")
    fsdplab(bin_, "import-kineto", *profiles, "--out-dir", imported)
    imp_report = simulate(bin_, imported, os.path.join(pred_dir, "imported.report.json"),
                          policy_flags)
    chk = fsdplab(bin_, "import-kineto", *profiles, "--out-dir",
                  os.path.join(pred_dir, "imported_check"), "--check", "--preset", "fsdp2",
                  *policy_flags, check=False)
    with open(os.path.join(pred_dir, "import_check.txt"), "w", encoding="utf-8") as f:
        f.write(f"exit {chk.returncode}\n{chk.stdout}{chk.stderr}")

    # Measured.
    timed = [per_step_max(rundir, p) for p in ("timed0", "timed1")
             if os.path.exists(os.path.join(rundir, f"{p}.rank0.json"))]
    steps = [x for t in timed for x in t]
    meas = spread_of(steps)
    meas["run_to_run"] = (abs(statistics.median(timed[0]) - statistics.median(timed[1]))
                          / meas["median"] if len(timed) > 1 else None)
    for key in ("fwd_bwd_us", "opt_us", "zero_grad_us"):
        meas[key] = statistics.median(
            x for p in ("timed0", "timed1")
            if os.path.exists(os.path.join(rundir, f"{p}.rank0.json"))
            for x in per_step_max(rundir, p, key))
    rec_rows = [trace_steps(load(os.path.join(traces, f"trace.rank{r}.json")))
                for r in range(WORLD)]
    # Per recorded step, the rank whose step was longer: its compute and time in collectives.
    slow = [max(rows, key=lambda x: x["span_us"]) for rows in zip(*rec_rows)]
    rec_steps = [x["span_us"] for x in slow]
    comm = [x["comm_us"] for x in slow]
    compute = [x["compute_us"] for x in slow]
    meas["recorded_span_us"] = statistics.median(rec_steps)
    meas["recorded_wall_us"] = statistics.median(per_step_max(rundir, "record"))
    # The unrecorded steps the record phase ran between its recorded ones (older grids: none).
    between = (per_step_max(rundir, "record", "between_us")
               if "between_us" in load(os.path.join(rundir, "record.rank0.json")) else [])
    meas["recorded_pair_us"] = statistics.median(between) if between else None
    meas["profiled_wall_us"] = statistics.median(per_step_max(rundir, "profile"))
    meas["exposed_comm_us"] = statistics.median(comm)
    meas["compute_us"] = statistics.median(compute)
    meas["idle_us"] = meas["median"] - meas["compute_us"] - meas["exposed_comm_us"]
    meas["collectives_vs_bench"] = collectives_vs_bench(rundir, rec_rows_raw(traces))
    meas["fsdp_work_us"] = statistics.median(fsdp_work(load(os.path.join(traces,
                                                                          "trace.rank0.json"))))
    cats, peak_phase, grads_in_temp = tracker_peak(rundir)
    meas["grads_in_temp"] = grads_in_temp
    meas["peak_bytes"] = cats["Total"]
    meas["peak_by_category"] = cats
    meas["peak_phase"] = peak_phase

    out = {"id": os.path.basename(rundir), "config": c, "measured": meas}
    for name, report in (("recorder", rec_report), ("imported", imp_report)):
        p = predicted(report)
        total = meas["median"]
        p["step_err"] = (p["step_us"] - total) / total
        p["comm_err"] = ((p["exposed_comm_us"] - meas["exposed_comm_us"])
                         / meas["exposed_comm_us"] if meas["exposed_comm_us"] else None)
        p["peak_err"] = (p["peak_bytes"] - meas["peak_bytes"]) / meas["peak_bytes"]
        # The step error split (fractions of the measured step; they add up to step_err).
        p["split"] = {
            "compute": (p["compute_us"] - meas["compute_us"]) / total,
            "exposed_comm": (p["exposed_comm_us"] - meas["exposed_comm_us"]) / total,
            "idle": (p["idle_us"] - meas["idle_us"]) / total,
        }
        groups = {}
        tracked = dict(cats, **{"Grads in Temp": grads_in_temp})
        for label, tk, sk in MEM_GROUPS:
            groups[label] = [tracker_sum(tracked, tk),
                             sum(p["peak_by_category"].get(k, 0) for k in sk)]
        p["memory_groups"] = groups
        exact = {}
        for group, labels in EXACT_GROUPS.items():
            t = sum(groups[lb][0] for lb in labels)
            q = sum(groups[lb][1] for lb in labels)
            exact[group] = (q - t) / t if t else (0.0 if q == 0 else None)
        p["memory_exact_err"] = exact
        out[name] = p
    # The profiler path's prediction of the unprofiled run: `import-kineto --check`'s prediction
    # less the profiler's cost it estimates from the profile (its "predicted without the
    # profiler" line); and, like with like, the imported prediction against the profiled steps.
    m = re.search(r"predicted without the profiler: ([0-9.]+) us", chk.stdout)
    imp = out["imported"]
    imp["unprofiled_step_us"] = float(m.group(1)) if m else None
    imp["unprofiled_step_err"] = ((imp["unprofiled_step_us"] - meas["median"]) / meas["median"]
                                  if m else None)
    imp["profiled_step_err"] = ((imp["step_us"] - meas["profiled_wall_us"])
                                / meas["profiled_wall_us"])
    # The same prediction against the unprofiled steps the profile phase timed in its own
    # process pair, as rec-p does for the recorder path.
    pair = unprofiled_pair_us(rundir, "profile")
    meas["profiled_pair_us"] = pair
    imp["pair_unprofiled_step_err"] = ((imp["unprofiled_step_us"] - pair) / pair
                                       if pair and m else None)
    # The recorder path against the unrecorded steps of the process pair that recorded the trace:
    # the timed pairs' median less the pair-to-pair noise (a pair's speed on these 2 cores
    # differs from another's by about the run-to-run spread).
    pair = meas["recorded_pair_us"]
    out["recorder"]["pair_step_err"] = (out["recorder"]["step_us"] - pair) / pair if pair else None
    # Exposed communication like with like: the recorder's trace of the profiled steps
    # (profile/recorded/), the slower rank's time in collectives per step, as for the record
    # phase's steps above.
    profiled = [os.path.join(rundir, "profile", "recorded", f"trace.rank{r}.json")
                for r in range(WORLD)]
    if all(os.path.exists(x) for x in profiled):
        rows = [trace_steps(load(x)) for x in profiled]
        comm = statistics.median(max(step, key=lambda x: x["span_us"])["comm_us"]
                                 for step in zip(*rows))
        meas["profiled_exposed_comm_us"] = comm
        imp["profiled_comm_err"] = (imp["exposed_comm_us"] - comm) / comm if comm else None

    # Recorder against importer, per unit and phase (rank 0; medians over steps): on the same
    # steps where the profile phase also recorded them, else the record phase's (another run).
    same = os.path.join(rundir, "profile", "recorded", "trace.rank0.json")
    out["agreement_same_run"] = os.path.exists(same)
    out["agreement"] = agreement(
        same if out["agreement_same_run"] else os.path.join(traces, "trace.rank0.json"),
        os.path.join(imported, "trace.rank0.json"))
    # The same on the `stack` phase's steps, whose profile has the Python frames: there the
    # import places FSDP2's hook Python and the recorder's own time by frame.
    stack = sorted(glob.glob(os.path.join(rundir, "stack", "trace.rank*.json.gz")))
    if stack:
        stack_imported = os.path.join(pred_dir, "imported_stack")
        chk = fsdplab(bin_, "import-kineto", *stack, "--out-dir", stack_imported, "--check",
                      "--preset", "fsdp2", *policy_flags, check=False)
        with open(os.path.join(pred_dir, "import_check_stack.txt"), "w", encoding="utf-8") as f:
            f.write(f"exit {chk.returncode}\n{chk.stdout}{chk.stderr}")
        out["agreement_stack"] = agreement(
            os.path.join(rundir, "stack", "recorded", "trace.rank0.json"),
            os.path.join(stack_imported, "trace.rank0.json"))
        # The profiler's cost with the Python tracer: the stack-profiled steps against the
        # unprofiled steps of the same process pair (older grids: the timed pairs' median), and
        # --check's prediction less its estimate (Python frames included) against them.
        m = re.search(r"predicted without the profiler: ([0-9.]+) us", chk.stdout)
        st = {"profiled_wall_us": statistics.median(per_step_max(rundir, "stack")),
              "pair_unprofiled_us": unprofiled_pair_us(rundir, "stack") or meas["median"]}
        base = st["pair_unprofiled_us"]
        st["profiled_vs_unprofiled"] = (st["profiled_wall_us"] - base) / base
        st["unprofiled_step_us"] = float(m.group(1)) if m else None
        st["unprofiled_step_err"] = (st["unprofiled_step_us"] - base) / base if m else None
        out["stack"] = st
    if c["policy"] != "default" and base_pred is not None:
        out["policy"] = base_pred
    with open(os.path.join(pred_dir, "graded.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)
    return out


def policy_change(rundir, base_dir, bin_):
    """Predicted change of the exported policy against FSDP2's defaults, on the base run's
    recorded traces (what a user sees before applying it)."""
    traces = os.path.join(base_dir, "traces")
    pred_dir = os.path.join(rundir, "pred")
    os.makedirs(pred_dir, exist_ok=True)
    default = simulate(bin_, traces, os.path.join(pred_dir, "base_default.report.json"))
    tuned = simulate(bin_, traces, os.path.join(pred_dir, "base_tuned.report.json"),
                     ["--policy", policy_file(rundir)])
    d, t = default["summary"]["step_time_us"], tuned["summary"]["step_time_us"]
    return {"predicted_default_us": d, "predicted_tuned_us": t, "predicted_change": (t - d) / d,
            **load(os.path.join(rundir, "policy", "source.json"))}


def paired_change(rundir):
    """The policy's change measured in one process pair (the `paired` phase: steps alternating
    between a model with FSDP2's defaults and one with the policy): the change of the medians,
    and the same from each half of the steps (how far it moves within the pair)."""
    if not os.path.exists(os.path.join(rundir, "paired.rank0.json")):
        return {}
    a = per_step_max(rundir, "paired", "default_us")
    b = per_step_max(rundir, "paired", "policy_us")

    def change(lo, hi):
        return statistics.median(b[lo:hi]) / statistics.median(a[lo:hi]) - 1

    half = len(a) // 2
    return {"paired_change": change(0, len(a)),
            "paired_halves": [change(0, half), change(half, len(a))],
            "paired_default_us": statistics.median(a), "paired_policy_us": statistics.median(b)}


def grade(out_dir, bin_):
    results = []
    runs = sorted(glob.glob(os.path.join(out_dir, "runs", "*", "done")))
    by_id = {}
    for done in runs:
        rundir = os.path.dirname(done)
        c = load(os.path.join(rundir, "config.json"))
        change = None
        if c["policy"] != "default":
            base_dir = os.path.join(out_dir, "runs", base_of(c))
            change = policy_change(rundir, base_dir, bin_)
        r = grade_run(rundir, bin_, change)
        by_id[r["id"]] = r
        results.append(r)
    for r in results:
        if "policy" in r:
            base = by_id.get(base_of(r["config"]))
            if base is not None:
                b = base["measured"]["median"]
                r["policy"]["measured_change"] = (r["measured"]["median"] - b) / b
                r["policy"].update(paired_change(os.path.join(out_dir, "runs", r["id"])))
                r["policy"]["spread"] = max(r["measured"]["range_rel"],
                                            base["measured"]["range_rel"])
    summary = summarize(results)
    env = {}
    if os.path.exists(os.path.join(out_dir, "grid.json")):
        env = load(os.path.join(out_dir, "grid.json"))
    doc = {"format": "fsdplab.fsdp2_grid", "version": 1, "grid": env, "summary": summary,
           "runs": results}
    with open(os.path.join(out_dir, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
    text = table(doc)
    with open(os.path.join(out_dir, "table.txt"), "w", encoding="utf-8") as f:
        f.write(text)
    print(text)


def summarize(results):
    def stats(xs):
        xs = [abs(x) for x in xs if x is not None]
        if not xs:
            return None
        return {"median_abs": statistics.median(xs), "p90_abs": pct(xs, 0.9), "n": len(xs)}

    s = {}
    for path in ("recorder", "imported"):
        s[path] = {k: stats([r[path][f"{k}_err"] for r in results])
                   for k in ("step", "comm", "peak")}
        s[path]["split_median"] = {
            k: statistics.median(r[path]["split"][k] for r in results)
            for k in ("compute", "exposed_comm", "idle")} if results else {}
    for k in ("unprofiled_step", "pair_unprofiled_step", "profiled_step", "profiled_comm"):
        s["imported"][k] = stats([r["imported"].get(f"{k}_err") for r in results])
    s["recorder"]["pair_step"] = stats([r["recorder"].get("pair_step_err") for r in results])
    for path in ("recorder", "imported"):
        peaks = [r[path]["peak_err"] for r in results]
        s[path]["memory_done"] = {
            "peak_within_3pct": sum(abs(x) <= 0.03 for x in peaks),
            "runs": len(peaks),
            **{k: sum(1 for r in results
                      if r[path].get("memory_exact_err", {}).get(k) is not None
                      and abs(r[path]["memory_exact_err"][k]) <= 0.01)
               for k in EXACT_GROUPS},
        }
    s["spread"] = {
        "range_rel": stats([r["measured"]["range_rel"] for r in results]),
        "p90_p50": stats([r["measured"]["p90_p50"] - 1 for r in results]),
        "run_to_run": stats([r["measured"]["run_to_run"] for r in results]),
    }
    ratios = [a["ratio"] for r in results for a in r["agreement"] if a["ratio"] is not None]
    s["agreement"] = stats([x - 1 for x in ratios])
    def by_phase(runs, key):
        """|ratio - 1| stats per phase over the runs' `key` rows, with the largest and how many
        lie within 5%."""
        out = {}
        for phase in ("all", "forward", "backward", "recompute"):
            xs = [a["ratio"] - 1 for r in runs for a in r[key]
                  if a["ratio"] is not None and (phase == "all" or a["phase"] == phase)]
            st = stats(xs)
            if st:
                st["max_abs"] = max(abs(x) for x in xs)
                st["within_5pct"] = sum(abs(x) <= 0.05 for x in xs)
            out[phase] = st
        return out

    # On the same steps (the profile phase recorded them too), per phase.
    same = [r for r in results if r.get("agreement_same_run")]
    s["agreement_same_run"] = by_phase(same, "agreement") if same else None
    # On the `stack` phase's steps (the import reads the Python frames): per phase, with the
    # largest difference and how many unit-phases lie within 5%.
    s["imported"]["stack_unprofiled_step"] = stats(
        [r.get("stack", {}).get("unprofiled_step_err") for r in results])
    s["imported"]["stack_profiled_vs_unprofiled"] = stats(
        [r.get("stack", {}).get("profiled_vs_unprofiled") for r in results])
    stacked = [r for r in results if r.get("agreement_stack")]
    if stacked:
        s["agreement_stack"] = by_phase(stacked, "agreement_stack")
        s["agreement_stack"]["missing"] = sum(
            1 for r in stacked for a in r["agreement_stack"] if a["ratio"] is None)
    return s


def fmt_pct(x, width=7):
    return f"{'-':>{width}s}" if x is None else f"{100 * x:+{width - 1}.1f}%"


def table(doc):
    runs = doc["runs"]
    lines = []
    g = doc.get("grid", {})
    if g:
        lines.append(f"FSDP2 grid: {len(runs)} runs, started {g.get('started')}, "
                     f"load {g.get('load_before')} -> {g.get('load_after')}, "
                     f"{g.get('wall_s')} s")
    lines.append("")
    lines.append("Step time (median of unrecorded steps, ms), spread (max-min)/median, p90/p50, "
                 "run-to-run; predicted error from the recorder (rec; rec-p: against the "
                 "unrecorded steps of the pair that recorded it), the imported profile (imp) and "
                 "that less the profiler's cost --check estimates (imp-p), and the rec error "
                 "split into compute / exposed comm / idle")
    h = (f"{'run':<34s} {'meas':>7s} {'range':>6s} {'p90':>6s} {'r2r':>6s} {'rec':>7s} "
         f"{'rec-p':>7s} {'imp':>7s} {'imp-p':>7s} {'cmp':>7s} {'comm':>7s} {'idle':>7s}")
    lines.append(h)
    for r in runs:
        m = r["measured"]
        lines.append(
            f"{r['id']:<34s} {m['median'] / 1e3:7.1f} {100 * m['range_rel']:5.1f}% "
            f"{100 * (m['p90_p50'] - 1):5.1f}% {fmt_pct(m['run_to_run'], 6)} "
            f"{fmt_pct(r['recorder']['step_err'])} "
            f"{fmt_pct(r['recorder'].get('pair_step_err'))} {fmt_pct(r['imported']['step_err'])} "
            f"{fmt_pct(r['imported'].get('unprofiled_step_err'))} "
            f"{fmt_pct(r['recorder']['split']['compute'])} "
            f"{fmt_pct(r['recorder']['split']['exposed_comm'])} "
            f"{fmt_pct(r['recorder']['split']['idle'])}")
    lines.append("")
    lines.append("Measured step parts (ms): fwd+bwd, optimizer, zero_grad; recorded compute, in "
                 "collectives, rest; predicted (rec) compute, exposed comm, idle; profiled step")
    lines.append(f"{'run':<34s} {'f+b':>7s} {'opt':>6s} {'zero':>5s} | {'cmp':>7s} {'coll':>6s} "
                 f"{'rest':>6s} | {'cmp':>7s} {'comm':>6s} {'idle':>6s} | {'prof':>7s}")
    for r in runs:
        m, p = r["measured"], r["recorder"]
        lines.append(
            f"{r['id']:<34s} {m['fwd_bwd_us'] / 1e3:7.1f} {m['opt_us'] / 1e3:6.1f} "
            f"{m['zero_grad_us'] / 1e3:5.1f} | {m['compute_us'] / 1e3:7.1f} "
            f"{m['exposed_comm_us'] / 1e3:6.1f} {m['idle_us'] / 1e3:6.1f} | "
            f"{p['compute_us'] / 1e3:7.1f} {p['exposed_comm_us'] / 1e3:6.1f} "
            f"{p['idle_us'] / 1e3:6.1f} | {m['profiled_wall_us'] / 1e3:7.1f}")
    lines.append("")
    lines.append("Inside the recorded step: FSDP2's own work outside collectives (ms, rank 0), "
                 "and the collectives against the same sizes benched alone (sum ms, ratio)")
    lines.append(f"{'run':<34s} {'fsdp':>6s} | {'AG step':>8s} {'bench':>7s} {'x':>5s} | "
                 f"{'RS step':>8s} {'bench':>7s} {'x':>5s}")
    for r in runs:
        m = r["measured"]
        cells = []
        for kind in ("all_gather", "reduce_scatter"):
            cb = (m.get("collectives_vs_bench") or {}).get(kind)
            cells.append(f"{cb['in_step_us'] / 1e3:8.1f} {cb['bench_us'] / 1e3:7.1f} "
                         f"{cb['ratio']:5.2f}" if cb else f"{'-':>8s} {'-':>7s} {'-':>5s}")
        lines.append(f"{r['id']:<34s} {m['fsdp_work_us'] / 1e3:6.1f} | {cells[0]} | {cells[1]}")
    lines.append("")
    lines.append("Exposed communication (ms; measured = time inside collectives, recorded) and "
                 "peak memory (MiB; measured = FSDPMemTracker)")
    lines.append(f"{'run':<34s} {'meas':>6s} {'rec':>6s} {'err':>7s} {'imp':>6s} {'err':>7s} | "
                 f"{'meas':>6s} {'rec':>6s} {'err':>7s} {'imp':>6s} {'err':>7s} at")
    mib = 1024.0 * 1024.0
    for r in runs:
        m, a, b = r["measured"], r["recorder"], r["imported"]
        lines.append(
            f"{r['id']:<34s} {m['exposed_comm_us'] / 1e3:6.1f} {a['exposed_comm_us'] / 1e3:6.1f} "
            f"{fmt_pct(a['comm_err'])} {b['exposed_comm_us'] / 1e3:6.1f} "
            f"{fmt_pct(b['comm_err'])} | {m['peak_bytes'] / mib:6.2f} {a['peak_bytes'] / mib:6.2f} "
            f"{fmt_pct(a['peak_err'])} {b['peak_bytes'] / mib:6.2f} {fmt_pct(b['peak_err'])} "
            f"{m['peak_phase'] or ''}")
    lines.append("")
    lines.append("Peak by category (MiB): FSDPMemTracker / recorder prediction / imported "
                 "prediction")
    labels = [g[0] for g in MEM_GROUPS]
    short = ["shP", "unshP+AG", "grad", "act", "temp", "opt", "RS", "in+buf"]
    lines.append(f"{'run':<34s} " + " ".join(f"{s:>17s}" for s in short))
    for r in runs:
        cells = []
        for label in labels:
            t, pr = r["recorder"]["memory_groups"][label]
            _, pi = r["imported"]["memory_groups"][label]
            cells.append(f"{t / mib:5.2f}/{pr / mib:5.2f}/{pi / mib:5.2f}")
        lines.append(f"{r['id']:<34s} " + " ".join(f"{x:>17s}" for x in cells))
    lines.append("")
    lines.append("Memory at the peak against FSDPMemTracker: peak error, and parameters (sharded "
                 "+ unsharded), gradients and optimizer state, error of each (recorder / imported)")
    lines.append(f"{'run':<34s} {'peak':>15s} {'params':>15s} {'grads':>15s} {'opt':>15s}")
    for r in runs:
        cells = [f"{fmt_pct(r['recorder']['peak_err'])}/{fmt_pct(r['imported']['peak_err'])}"]
        for k in ("params", "grads", "opt"):
            a = r["recorder"].get("memory_exact_err", {}).get(k)
            b = r["imported"].get("memory_exact_err", {}).get(k)
            cells.append(f"{fmt_pct(a)}/{fmt_pct(b)}")
        lines.append(f"{r['id']:<34s} " + " ".join(f"{c:>15s}" for c in cells))
    lines.append("")
    lines.append("Recorder vs importer compute per unit and phase (imported / recorded, rank 0): "
                 "median and range of the ratio over units, per phase; [same]: the profiled "
                 "steps recorded too, else the record phase's steps")
    def ratios(rows, digits):
        """Per phase the median and range of imported / recorded over units, and the
        unit-phases only one side has."""
        parts = []
        for phase in ("forward", "backward", "recompute"):
            xs = [a["ratio"] for a in rows if a["phase"] == phase and a["ratio"]]
            if xs:
                parts.append(f"{phase} {statistics.median(xs):.{digits}f} [{min(xs):.{digits}f}, "
                             f"{max(xs):.{digits}f}]")
        missing = [f"{a['unit']}/{a['phase']}" for a in rows if a["ratio"] is None]
        return "; ".join(parts) + (f"; only one side: {', '.join(missing)}" if missing else "")

    for r in runs:
        lines.append(f"{r['id']:<34s} " + ("[same] " if r.get("agreement_same_run") else "")
                     + ratios(r["agreement"], 2))
    if any(r.get("agreement_stack") for r in runs):
        lines.append("")
        lines.append("The same on the stack phase's steps (a profile with the Python frames: "
                     "FSDP2's hook Python and the recorder's own time placed by frame): median "
                     "and range of imported / recorded, per phase")
        for r in runs:
            rows = r.get("agreement_stack")
            lines.append(f"{r['id']:<34s} " + (ratios(rows, 3) if rows else "no stack phase"))
    pol = [r for r in runs if "policy" in r and "measured_change" in r["policy"]]
    if pol:
        lines.append("")
        lines.append("Exported policy against FSDP2's defaults: measured change (timed medians), "
                     "predicted change (simulate on the base run's trace), spread")
        for r in pol:
            p = r["policy"]
            lines.append(f"{r['id']:<34s} measured {fmt_pct(p['measured_change'])} predicted "
                         f"{fmt_pct(p['predicted_change'])} spread {100 * p['spread']:.1f}% "
                         f"({p['policy']} policy; tune predicted "
                         f"{fmt_pct(p['tune_predicted_change']).strip()})")
            if "paired_change" in p:
                h = p["paired_halves"]
                lines.append(f"{'':<34s} in one process pair, steps alternating: measured "
                             f"{fmt_pct(p['paired_change'])} (halves {fmt_pct(h[0]).strip()}, "
                             f"{fmt_pct(h[1]).strip()}; {p['paired_default_us'] / 1e3:.1f} -> "
                             f"{p['paired_policy_us'] / 1e3:.1f} ms)")
    s = doc["summary"]
    lines.append("")
    lines.append("Summary (|error|: median / p90 over runs)")
    for path in ("recorder", "imported"):
        parts = []
        for k in ("step", "comm", "peak"):
            st = s[path][k]
            if st:
                parts.append(f"{k} {100 * st['median_abs']:.1f}% / {100 * st['p90_abs']:.1f}%")
        sp = s[path]["split_median"]
        lines.append(f"  {path:<9s} " + ", ".join(parts) + "; median split: "
                     + ", ".join(f"{k} {fmt_pct(v).strip()}" for k, v in sp.items()))
        for k, what in (("pair_step", "step against the unrecorded steps of the pair that "
                         "recorded it (rec-p)"),
                        ("unprofiled_step", "step less the profiler's estimated cost (--check) "
                         "against the unprofiled steps (imp-p)"),
                        ("pair_unprofiled_step", "the same against the unprofiled steps of the "
                         "pair that profiled it (imp-pp)"),
                        ("profiled_step", "step against the profiled steps (like with like)"),
                        ("profiled_comm", "exposed comm against the profiled steps' (like with "
                         "like)"),
                        ("stack_profiled_vs_unprofiled", "with_stack: the profiled steps against "
                         "the same pair's unprofiled ones (profiler, tracer and recorder)"),
                        ("stack_unprofiled_step", "with_stack: step less the profiler's "
                         "estimated cost, Python frames included, against those unprofiled "
                         "steps")):
            st = s[path].get(k)
            if st:
                lines.append(f"  {'':<9s} {what}: {100 * st['median_abs']:.1f}% / "
                             f"{100 * st['p90_abs']:.1f}%")
        md = s[path].get("memory_done")
        if md:
            lines.append(f"  {'':<9s} memory: peak within 3% on {md['peak_within_3pct']} of "
                         f"{md['runs']} runs; within 1% at the peak: params {md['params']}, "
                         f"grads {md['grads']}, optimizer state {md['opt']}")
    for k, st in s["spread"].items():
        if st:
            lines.append(f"  spread {k}: median {100 * st['median_abs']:.1f}%, p90 "
                         f"{100 * st['p90_abs']:.1f}%")
    if s["agreement"]:
        lines.append(f"  recorder vs importer |ratio - 1|: median "
                     f"{100 * s['agreement']['median_abs']:.1f}%, p90 "
                     f"{100 * s['agreement']['p90_abs']:.1f}% ({s['agreement']['n']} unit-phases)")
    if s.get("agreement_same_run"):
        parts = [f"{phase} {100 * st['median_abs']:.1f}% / {100 * st['p90_abs']:.1f}% "
                 f"({st['n']})" for phase, st in s["agreement_same_run"].items() if st]
        lines.append("  recorder vs importer on the same steps |ratio - 1| median / p90: "
                     + ", ".join(parts))
    st = s.get("agreement_stack")
    if st and st.get("all"):
        parts = [f"{phase} {100 * x['median_abs']:.1f}% / {100 * x['p90_abs']:.1f}% / max "
                 f"{100 * x['max_abs']:.1f}% ({x['n']})" for phase, x in st.items()
                 if phase != "missing" and x]
        lines.append("  the same with the Python frames (stack phase) median / p90 / max: "
                     + ", ".join(parts) + f"; within 5%: {st['all']['within_5pct']} of "
                     f"{st['all']['n']}" + (f"; {st['missing']} on one side only"
                                            if st["missing"] else ""))
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------------------------------
# The spread study: the timed phase of one configuration under each isolation level.


def spread(args):
    """The timed phase of one configuration under each isolation level, the levels interleaved
    (rep 0 of every level, then rep 1, ...) so that the machine's drift falls on all of them."""
    os.makedirs(args.out, exist_ok=True)
    c = next(c for c in design(False) if run_id(c) == args.config)
    rows = []
    for rep in range(args.repeats):
        for level in args.levels.split(","):
            rundir = os.path.join(args.out, f"{level}.{rep}")
            os.makedirs(rundir, exist_ok=True)
            waited, _ = wait_idle(args.wait_idle) if args.wait_idle else (0.0, None)
            with OthersLoad() as o:
                run_phase(rundir, c, "timed0", args, isolation=level)
            steps = per_step_max(rundir, "timed0")
            s = spread_of(steps)
            s.update(level=level, rep=rep, others_cpu=o.fraction, waited_s=waited,
                     steps_us=steps)
            rows.append(s)
            print(f"{level:<10s} rep {rep}: median {s['median'] / 1e3:.1f} ms, range "
                  f"{100 * s['range_rel']:.1f}%, p90/p50 {s['p90_p50']:.3f} (other processes "
                  f"{100 * o.fraction:.0f}% of the cores)", flush=True)
    with open(os.path.join(args.out, "spread.json"), "w", encoding="utf-8") as f:
        json.dump({"config": c, "steps": args.steps, "warmup": args.warmup, "rows": rows}, f,
                  indent=1)
    for level in args.levels.split(","):
        mine = [r for r in rows if r["level"] == level]
        meds = [r["median"] for r in mine]
        print(f"{level:<10s} range {statistics.median(r['range_rel'] for r in mine) * 100:.1f}% "
              f"p90/p50 {statistics.median(r['p90_p50'] for r in mine):.3f} run-to-run "
              f"{100 * (max(meds) - min(meds)) / statistics.median(meds):.1f}% (medians of "
              f"{len(mine)} runs)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run")
    p.add_argument("--out", required=True)
    p.add_argument("--fsdplab", required=True)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", help="runs whose id matches this regular expression")
    p.add_argument("--force", action="store_true", help="run again runs already done in --out")
    p.add_argument("--phases", help="comma-separated record, profile, mem: run only these "
                                    "phases again in the complete runs of --out")
    p.add_argument("--repeats", type=int, default=2, help="timed process pairs per run")
    p.add_argument("--wait-idle", type=float, default=0.0,
                   help="before each run, wait up to S seconds for other processes to leave the "
                        "cores (under 25%% of them for 3 s)")
    for q in (p, sub.add_parser("rank"), sub.add_parser("spread")):
        q.add_argument("--steps", type=int, default=20)
        q.add_argument("--warmup", type=int, default=5)
        # The recorder path predicts from the mean of the recorded steps after the first (a
        # memory step): 7 of them against the timed runs' 2 x 20 (with 2, a recorded step's
        # noise, 10-15% on these CPU runs, went whole into the prediction). The profiled steps
        # stay few: a profile of many steps is large and slow to import.
        q.add_argument("--record-steps", type=int, default=8)
        q.add_argument("--profile-steps", type=int, default=3)
        # The stack phase compares per unit on the median of its steps after the first: with 2,
        # one stall (a collection, the OS) inside a recorder hook that returns at once, which
        # the recorder leaves with the unit and the import with the recorder, moved a unit's
        # median by up to 8%.
        q.add_argument("--stack-steps", type=int, default=6)
    q = sub.choices["rank"]
    q.add_argument("--rank", type=int, required=True)
    q.add_argument("--phase", required=True)
    q.add_argument("--dir", required=True)
    q.add_argument("--config", required=True)
    q.add_argument("--isolation", choices=ISOLATION, default="pinned")
    q.add_argument("--bench", action="store_true", help="time the model's collectives alone")
    q = sub.choices["spread"]
    q.add_argument("--out", required=True)
    q.add_argument("--config", default="encoder-l-ac0-mb1-rs1-default")
    q.add_argument("--levels", default=",".join(ISOLATION))
    q.add_argument("--repeats", type=int, default=3)
    q.add_argument("--wait-idle", type=float, default=0.0)
    p = sub.add_parser("regrade")
    p.add_argument("dir")
    p.add_argument("--fsdplab", required=True)
    args = ap.parse_args()
    if args.cmd == "run":
        if args.quick:
            args.steps, args.warmup, args.record_steps, args.repeats = 6, 2, 2, 1
            args.profile_steps = args.stack_steps = 2
        run(args)
    elif args.cmd == "rank":
        rank_main(args)
    elif args.cmd == "spread":
        spread(args)
    else:
        grade(args.dir, args.fsdplab)


if __name__ == "__main__":
    main()
