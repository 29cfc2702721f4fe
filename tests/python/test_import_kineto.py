"""`fsdplab import-kineto` on real PyTorch profiler traces: FSDP2 (fully_shard), CPU, gloo, 2 ranks,
a 4-layer transformer with and without activation checkpointing, profiled with
torch.profiler(record_shapes=True) while fsdplab.torch's Recorder records the same step.
The imported traces must validate and simulate, and their units, parameter counts, orders,
collectives and each unit's compute must equal the recorder's.

Needs torch 2.x (FSDP2); skipped with the reason under an older torch.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import unittest

FSDPLAB = os.environ.get("FSDPLAB_BIN", "fsdplab")
PYTHON_DIR = os.environ.get(
    "FSDPLAB_PYTHON_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "python")
)

PROFILE_SCRIPT = textwrap.dedent(
    """
    import sys
    import torch, torch.nn as nn, torch.distributed as dist
    sys.path.insert(0, sys.argv[1])
    import fsdplab.torch as fsdplab_torch
    rank, world, store, out = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
    from torch.distributed.fsdp import fully_shard
    from torch.utils.checkpoint import checkpoint
    D, L, V = 128, 4, 256

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(D, 4, batch_first=True)
            self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
            self.fc1, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        def forward(self, x):
            h = self.ln1(x)
            x = x + self.attn(h, h, h, need_weights=False)[0]
            return x + self.fc2(torch.relu(self.fc1(self.ln2(x))))

    class Net(nn.Module):
        def __init__(self, ac):
            super().__init__()
            self.ac = ac
            self.embed = nn.Embedding(V, D)
            self.layers = nn.ModuleList([Block() for _ in range(L)])
            self.head = nn.Linear(D, V)
        def forward(self, ids):
            h = self.embed(ids)
            for layer in self.layers:
                h = checkpoint(layer, h, use_reentrant=False) if self.ac else layer(h)
            return self.head(h)

    ids = torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(1))
    for ac in (False, True):
        tag = "ac" if ac else "plain"
        torch.manual_seed(0)
        m = Net(ac)
        for layer in m.layers:
            fully_shard(layer)
        fully_shard(m)
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        # memory_steps=0: the recorder's memory probe is a dispatch mode, under which the
        # profiler would see every operator twice.
        rec = fsdplab_torch.Recorder(m, memory_steps=0)
        if rank == 0:
            rec.save_model(f"{out}/{tag}.model.json")
        def step():
            m(ids).sum().backward()
            opt.step()
            opt.zero_grad()
        # Steps 0 and 1 run unprofiled (FSDP's lazy init) and as the warm-up; step 2 is both
        # profiled (ProfilerStep#2) and recorded.
        sched = torch.profiler.schedule(wait=1, warmup=1, active=1, repeat=1)
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True, schedule=sched
        ) as prof:
            for i in range(3):
                if i == 2:
                    with rec.step():
                        step()
                else:
                    step()
                prof.step()
        prof.export_chrome_trace(f"{out}/{tag}.kineto.rank{rank}.json")
        rec.save(f"{out}/{tag}.recorder.json")  # .rank<R> added by the recorder
    dist.destroy_process_group()
    """
)


def fsdp2_available():
    try:
        import torch  # noqa: F401
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except Exception as e:  # torch 1.13: no fully_shard
        return f"no FSDP2 ({type(e).__name__}: {e})"
    return None


def fsdplab(*args):
    return subprocess.run([FSDPLAB, *args], capture_output=True, text=True, timeout=300)


def numel(param):
    if "numel" in param:
        return param["numel"]
    n = 1
    for d in param["shape"]:
        n *= d
    return n


class ImportKinetoTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        why = fsdp2_available()
        if why:
            raise unittest.SkipTest(why)
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = cls.tmp.name
        store = os.path.join(cls.dir, "store")
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", PROFILE_SCRIPT, PYTHON_DIR, str(r), "2", store, cls.dir],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
            for r in range(2)
        ]
        try:
            for p in procs:
                _, err = p.communicate(timeout=300)
                if p.returncode != 0:
                    raise AssertionError(f"FSDP2 rank failed ({p.returncode}): {err[-3000:]}")
        finally:
            for p in procs:  # a rank left waiting for a failed peer
                if p.poll() is None:
                    p.kill()
                    p.communicate()
        cls.imported = {}
        for tag in ("plain", "ac"):
            out = os.path.join(cls.dir, f"{tag}.imported")
            r = fsdplab("import-kineto", *[os.path.join(cls.dir, f"{tag}.kineto.rank{k}.json")
                                           for k in range(2)], "--out-dir", out)
            if r.returncode != 0:
                raise AssertionError(f"import-kineto failed ({r.returncode}): {r.stderr}")
            cls.imported[tag] = out

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def trace(self, tag, rank, kind):
        path = (os.path.join(self.imported[tag], f"trace.rank{rank}.json") if kind == "imported"
                else os.path.join(self.dir, f"{tag}.recorder.rank{rank}.json"))
        with open(path, encoding="utf-8") as f:
            return path, json.load(f)

    def test_imported_traces_validate_and_simulate(self):
        for tag in ("plain", "ac"):
            for r in range(2):
                path, t = self.trace(tag, r, "imported")
                self.assertEqual((t["meta"]["world_size"], t["meta"]["rank"]), (2, r))
                v = fsdplab("validate", path, "--json")
                self.assertEqual(v.returncode, 0, v.stdout + v.stderr)
            s = fsdplab("simulate", "--rank-trace", self.imported[tag], "--json")
            self.assertEqual(s.returncode, 0, s.stderr)
            self.assertEqual(json.loads(s.stdout)["errors"], [])

    def test_units_and_parameter_counts_equal_the_recorders(self):
        for tag in ("plain", "ac"):
            for r in range(2):
                _, imp = self.trace(tag, r, "imported")
                _, rec = self.trace(tag, r, "recorder")
                self.assertEqual(
                    [(u["name"], u["parent"]) for u in imp["units"]],
                    [(u["name"], u["parent"]) for u in rec["units"]],
                )
                # Every dim 0 is even: FSDP pads nothing on 2 ranks, so the counts are exact.
                self.assertEqual(
                    [sum(numel(p) for p in u["params"]) for u in imp["units"]],
                    [sum(numel(p) for p in u["params"]) for u in rec["units"]],
                )

    def test_orders_equal_the_recorders(self):
        for tag in ("plain", "ac"):
            imp, _ = self.trace(tag, 0, "imported")
            rec, _ = self.trace(tag, 0, "recorder")
            orders = []
            for path in (imp, rec):
                r = fsdplab("order", path, "--order", "recorded", "--json")
                self.assertEqual(r.returncode, 0, r.stderr)
                orders.append(json.loads(r.stdout))
            self.assertEqual(orders[0], orders[1], tag)

    def test_collectives_equal_the_recorders(self):
        # Per kind, the same units in the same order with the same bytes.
        def collectives(t, kind):
            return [(e["unit"], e["bytes"]) for s in t["steps"] for mb in s["microbatches"]
                    for e in mb["events"] if e["op"] == "collective" and e["kind"] == kind]
        for tag in ("plain", "ac"):
            for r in range(2):
                _, imp = self.trace(tag, r, "imported")
                _, rec = self.trace(tag, r, "recorder")
                for kind in ("all_gather", "reduce_scatter"):
                    self.assertEqual(collectives(imp, kind), collectives(rec, kind), (tag, kind))
                # Both ranks' profiles given: every collective is split into wait and transfer.
                for s in imp["steps"]:
                    for e in s["microbatches"][0]["events"]:
                        if e["op"] == "collective":
                            self.assertGreaterEqual(e["args"]["wait_us"], 0)
                            self.assertGreaterEqual(e["args"]["transfer_us"], 0)

    def test_recomputation_found_only_with_checkpointing(self):
        for tag, expect in (("plain", 0), ("ac", 4)):
            _, imp = self.trace(tag, 0, "imported")
            units = {e["unit"] for e in imp["steps"][0]["microbatches"][0]["events"]
                     if e["op"] == "compute" and e["phase"] == "recompute"}
            self.assertEqual(len(units), expect, (tag, units))

    def test_unit_compute_is_the_recorders_definition(self):
        # One definition of a unit's compute: the time its work holds the thread between its
        # hooks, the framework's gaps included, less FSDP's own work and collectives. Both
        # measured the same step: the same units and phases, and the median unit-phase's
        # imported / recorded time within 10% of 1 (the FSDP2 grid: 2.7% median over 408
        # unit-phases; the operators' busy time alone, the earlier definition, came to 0.79).
        # A median, not the total: one unit the profiler happens to stall (a first backward
        # unit 2.5-3.5 ms long under load) moves a total of a few units by a quarter.
        for tag in ("plain", "ac"):
            for r in range(2):
                _, imp = self.trace(tag, r, "imported")
                _, rec = self.trace(tag, r, "recorder")
                a, b = self.per_unit(imp), self.per_unit(rec)
                self.assertEqual(sorted(a), sorted(b), (tag, r))
                ratios = sorted(a[k] / b[k] for k in a if b[k] > 0)
                self.assertEqual(len(ratios), len(a), (tag, r, a, b))
                self.assertLess(abs(statistics.median(ratios) - 1), 0.10, (tag, r, a, b))

    def test_layers_agree_in_every_phase(self):
        # On the same step each layer's forward, backward and recomputation is the same time to
        # both (imported / recorded = 1 by the definition), up to the Python neither can place
        # exactly: a layer's return path before FSDP's post-forward range, which the import
        # gives FSDP (1-2% of a layer here). Per phase, the median over the layers of both ranks
        # within 4% of 1: a median, as a layer of ~1 ms that the machine stalls in the
        # recorder's own hook time (dropped by the recorder, the unit's to the profile) moves by
        # up to 10% under load. Before both sides bracketed FSDP's whole hooks, ended a
        # backward at FSDP's post-backward (after the inputs' gradients) and began a
        # recomputation at the checkpoint's unpack, those medians were 0.93-0.95 in forward and
        # 1.12-1.13 in recomputation; now 0.99-1.02. The root is left out: its own work here
        # (the embedding, the head, the checkpoint calls) is a few hundred microseconds, so the
        # tens of microseconds of its Python a profile without Python stacks cannot tell from
        # FSDP's hooks move it by tens of percent.
        for tag in ("plain", "ac"):
            ratios = {}
            for r in range(2):
                _, imp = self.trace(tag, r, "imported")
                _, rec = self.trace(tag, r, "recorder")
                a, b = self.per_unit(imp), self.per_unit(rec)
                for key in (k for k in a if k[0] != "model"):
                    self.assertIn(key, b, (tag, r))
                    ratios.setdefault(key[1], []).append(a[key] / b[key])
            phases = ["backward", "forward"] + (["recompute"] if tag == "ac" else [])
            self.assertEqual(sorted(ratios), phases, tag)
            for phase, v in ratios.items():
                with self.subTest(tag=tag, phase=phase):
                    self.assertLess(abs(statistics.median(v) - 1), 0.04, sorted(v))

    @staticmethod
    def per_unit(t):
        """(unit, phase) -> the step's summed compute (step 0, every microbatch)."""
        out = {}
        for mb in t["steps"][0]["microbatches"]:
            for e in mb["events"]:
                if e["op"] == "compute" and e.get("unit"):
                    key = (e["unit"], e["phase"])
                    out[key] = out.get(key, 0.0) + e["us"]
        return out

    def test_model_json_from_the_recorder_gives_names_and_shapes(self):
        # The recorder's model file replaces the recorded shapes: the imported units then carry
        # the recorder's parameter names and shapes exactly.
        out = os.path.join(self.dir, "with_model.json")
        r = fsdplab("import-kineto", os.path.join(self.dir, "plain.kineto.rank0.json"),
                    "--model-json", os.path.join(self.dir, "plain.model.json"), "-o", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out, encoding="utf-8") as f:
            imp = json.load(f)
        _, rec = self.trace("plain", 0, "recorder")
        strip = lambda units: [(u["name"], u["parent"], u["params"]) for u in units]  # noqa: E731
        self.assertEqual(strip(imp["units"]), strip(rec["units"]))

    def test_check_report_runs(self):
        files = [os.path.join(self.dir, f"plain.kineto.rank{k}.json") for k in range(2)]
        out = os.path.join(self.dir, "check")
        r = fsdplab("import-kineto", *files, "--out-dir", out, "--check")
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = [line.split() for line in r.stdout.splitlines() if line.strip().startswith("#2")]
        self.assertEqual(len(rows), 1, r.stdout)
        measured, predicted = float(rows[0][1]), float(rows[0][2])
        self.assertGreater(measured, 0)
        self.assertGreater(predicted, 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
