"""`fsdplab export-policy --to fsdp2` closed on a real FSDP2 (torch 2.x, CPU, gloo, 2 ranks):
record a default step, export a per-unit policy resolved on that trace, apply it to a fresh
fully_shard model (rank 0 through the generated script, rank 1 through
fsdplab_torch.apply_policy and the JSON form), and check from FSDP2's own unshard calls which
all-gathers each pre-hook issued. Without the lists FSDP2 gathers each layer in its own
pre_forward, so the check fails if the policy is not applied. Then the measured steps beside
the simulator's predictions under the fsdp2 preset and under the policy."""

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

import torch

FSDPLAB = os.environ.get("FSDPLAB_BIN", "")
PYTHON_DIR = os.environ.get("FSDPLAB_PYTHON_DIR", "")

# Root "model" (embedding and head), layers 0-3. Recorded order: forward model, layers.0 .. 3;
# backward model, layers.3 .. 0.
POLICY = {
    "order": "recorded",
    "forward_prefetch": "1",
    "backward_prefetch": "1",
    "prefetch_first_unit": False,
    "units": {
        "model": {"backward_prefetch": "2"},
        "model.layers.0": {"forward_prefetch": "2"},
        "model.layers.3": {"backward_prefetch": "0", "reshard_after_forward": False},
    },
}

# The all-gathers each pre-hook issues under POLICY (FSDP2 semantics: an unshard of a module
# already unsharded or in flight is a no-op), derived by hand:
#   pre_forward ''       : '' on demand, then its list [layers.0]
#   pre_forward layers.0 : itself in flight; list [layers.1, layers.2]
#   pre_forward layers.1 : itself in flight; list [layers.2] in flight: nothing
#   pre_forward layers.2 : list [layers.3]
#   pre_forward layers.3 : in flight, empty list; it keeps its parameters (reshard false)
#   pre_backward ''      : the root kept its parameters; list [layers.3 (unsharded), layers.2]
#   pre_backward layers.3: budget 0, no FSDP2 list for it: [] leaves FSDP2's default on, the
#                          module before it in post-forward order (layers.2), in flight: nothing
#   pre_backward layers.2: list [layers.1];  layers.1: [layers.0];  layers.0: [] (the default has
#                          nothing before the first module: nothing)
EXPECTED = [
    ["pre_forward", "", ["", "layers.0"]],
    ["pre_forward", "layers.0", ["layers.1", "layers.2"]],
    ["pre_forward", "layers.1", []],
    ["pre_forward", "layers.2", ["layers.3"]],
    ["pre_forward", "layers.3", []],
    ["pre_backward", "", ["layers.2"]],
    ["pre_backward", "layers.3", []],
    ["pre_backward", "layers.2", ["layers.1"]],
    ["pre_backward", "layers.1", ["layers.0"]],
    ["pre_backward", "layers.0", []],
]

SCRIPT = textwrap.dedent(
    """
    import importlib.util, json, os, subprocess, sys, time
    import torch, torch.nn as nn, torch.distributed as dist
    sys.path.insert(0, sys.argv[1])
    import fsdplab.torch as fsdplab_torch
    rank, world, store, tmp, fsdplab = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(64, 256), nn.Linear(256, 64)
        def forward(self, x):
            return x + self.fc2(torch.relu(self.fc1(x)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(128, 64)
            self.layers = nn.ModuleList([Block() for _ in range(4)])
            self.head = nn.Linear(64, 128)
        def forward(self, ids):
            h = self.embed(ids)
            for layer in self.layers:
                h = layer(h)
            return self.head(h)

    def build():
        torch.manual_seed(0)
        m = Net()
        for layer in m.layers:
            fully_shard(layer)
        fully_shard(m)
        return m

    torch.manual_seed(1)
    ids = torch.randint(0, 128, (8, 32))
    def step(m):
        dist.barrier()
        t0 = time.perf_counter()
        m(ids).sum().backward()
        m.zero_grad(set_to_none=True)
        return (time.perf_counter() - t0) * 1e6

    def measured(m, n=3):
        return sorted(step(m) for _ in range(n))[n // 2]

    # 1. FSDP2 as it comes: a recorded step (the trace the policy is exported on).
    a = build()
    step(a)  # lazy initialisation
    rec = fsdplab_torch.Recorder(a)
    with rec.step():
        step(a)
    rec.save(os.path.join(tmp, "trace.json"))
    default_us = measured(a)
    rec.remove()
    dist.barrier()
    # 2. Rank 0 exports the policy (python and json) on its trace.
    if rank == 0:
        for fmt, out in (("python", "apply_fsdp2.py"), ("json", "fsdp2.json")):
            subprocess.run([fsdplab, "export-policy", os.path.join(tmp, "policy.json"),
                            "--trace", os.path.join(tmp, "trace.rank0.json"), "--to", "fsdp2",
                            "--format", fmt, "-o", os.path.join(tmp, out)], check=True)
    dist.barrier()
    # 3. A fresh model with the policy applied: rank 0 runs the generated script, rank 1 the
    #    recorder package's apply_policy on the JSON.
    b = build()
    if rank == 0:
        spec = importlib.util.spec_from_file_location("apply_fsdp2", os.path.join(tmp, "apply_fsdp2.py"))
        script = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(script)
        notes = script.apply(b)
    else:
        notes = fsdplab_torch.apply_policy(b, os.path.join(tmp, "fsdp2.json"))
    step(b)  # lazy initialisation
    # 4. Which all-gathers each pre-hook issues: FSDP2's own unshard, which does nothing for a
    #    module already unsharded or in flight.
    log = []
    orig_unshard, orig_pre_fwd, orig_pre_bwd = (
        FSDPParamGroup.unshard, FSDPParamGroup.pre_forward, FSDPParamGroup.pre_backward)
    def unshard(self, *args, **kwargs):
        if self._all_gather_result is None and not self.is_unsharded and log:
            log[-1][2].append(self._module_fqn)
        return orig_unshard(self, *args, **kwargs)
    def pre_forward(self, *args, **kwargs):
        log.append(["pre_forward", self._module_fqn, []])
        return orig_pre_fwd(self, *args, **kwargs)
    def pre_backward(self, *args, **kwargs):
        if self._training_state != TrainingState.PRE_BACKWARD:
            log.append(["pre_backward", self._module_fqn, []])
        return orig_pre_bwd(self, *args, **kwargs)
    FSDPParamGroup.unshard, FSDPParamGroup.pre_forward, FSDPParamGroup.pre_backward = (
        unshard, pre_forward, pre_backward)
    step(b)
    FSDPParamGroup.unshard, FSDPParamGroup.pre_forward, FSDPParamGroup.pre_backward = (
        orig_unshard, orig_pre_fwd, orig_pre_bwd)
    policy_us = measured(b)
    print(json.dumps({"log": log, "notes": notes, "default_us": default_us,
                      "policy_us": policy_us}))
    dist.destroy_process_group()
    """
)


def fsdp2_available():
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except Exception as e:  # torch 1.13 on Python 3.11 fails inside torch.distributed._shard
        return f"torch {torch.__version__}: no fully_shard ({type(e).__name__}: {e})"
    return None


def simulated_step_us(trace, *flags):
    out = subprocess.run(
        [FSDPLAB, "simulate", trace, "--json", *flags], check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out)["summary"]["step_time_us"]


class ExportPolicyFsdp2Test(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        why = fsdp2_available()
        if why:
            raise unittest.SkipTest(why)
        if not FSDPLAB:
            raise AssertionError("FSDPLAB_BIN is not set (ctest sets it)")
        cls.tmp = tempfile.TemporaryDirectory()
        tmp = cls.tmp.name
        with open(os.path.join(tmp, "policy.json"), "w", encoding="utf-8") as f:
            json.dump(POLICY, f)
        store = os.path.join(tmp, "store")
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", SCRIPT, PYTHON_DIR, str(r), "2", store, tmp, FSDPLAB],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for r in range(2)
        ]
        results = [p.communicate(timeout=300) for p in procs]
        for p, (o, e) in zip(procs, results):
            if p.returncode != 0:
                raise AssertionError(f"FSDP2 rank failed ({p.returncode}): {e}")
        cls.results = [json.loads(o.strip().splitlines()[-1]) for o, _ in results]
        cls.trace = os.path.join(tmp, "trace.rank0.json")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_trace_order_is_the_one_the_expectation_assumes(self):
        out = subprocess.run(
            [FSDPLAB, "order", self.trace, "--order", "recorded", "--json"],
            check=True, capture_output=True, text=True,
        ).stdout
        order = json.loads(out)
        layers = [f"model.layers.{i}" for i in range(4)]
        self.assertEqual(order["forward"], ["model"] + layers)
        self.assertEqual(order["backward"], ["model"] + layers[::-1])

    def test_fsdp2_issues_the_all_gathers_the_policy_says(self):
        for r in range(2):  # rank 0 applied the script, rank 1 the JSON
            self.assertEqual(self.results[r]["log"], EXPECTED, f"rank {r}")

    def test_inexpressible_parts_are_noted(self):
        # The budget-0 backward is not expressible (FSDP2's default runs instead); the recorded
        # order is noted too.
        notes = self.results[0]["notes"]
        self.assertEqual(notes, self.results[1]["notes"])
        self.assertTrue(any("first pass" in n for n in notes), notes)
        self.assertTrue(any(n.startswith("backward budget 0 ('layers.3')") for n in notes), notes)

    def test_a_missing_module_is_an_error_naming_it(self):
        sys.path.insert(0, PYTHON_DIR)
        import fsdplab.torch as fsdplab_torch  # noqa: PLC0415

        with open(os.path.join(self.tmp.name, "fsdp2.json"), encoding="utf-8") as f:
            plan = json.load(f)
        plan["modules"][1]["fqn"] = "layers.9"
        with self.assertRaises(fsdplab_torch.PolicyError) as cm:
            fsdplab_torch.apply_policy(torch.nn.Sequential(), plan)
        self.assertIn("'layers.9'", str(cm.exception))
        with self.assertRaises(fsdplab_torch.PolicyError) as cm:
            fsdplab_torch.apply_policy(torch.nn.Sequential(), POLICY)
        self.assertIn("fsdplab export-policy", str(cm.exception))

    def test_measured_steps_beside_the_predictions(self):
        # CPU gloo all-gathers block the host, so prefetch cannot overlap here: the point is
        # the three numbers side by side, and that both predictions run on the recorded trace.
        preset = simulated_step_us(self.trace, "--preset", "fsdp2")
        tuned = simulated_step_us(self.trace, "--policy", os.path.join(self.tmp.name, "policy.json"))
        r = self.results[0]
        print(
            f"\nmeasured default {r['default_us']:.0f} us, policy {r['policy_us']:.0f} us; "
            f"predicted fsdp2 preset {preset:.0f} us, policy {tuned:.0f} us",
            file=sys.stderr,
        )
        self.assertGreater(preset, 0)
        self.assertGreater(tuned, 0)


if __name__ == "__main__":
    unittest.main()
