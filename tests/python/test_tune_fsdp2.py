"""`fsdplab tune --preset fsdp2` closed on a real FSDP2 run (torch 2.x, CPU, gloo, 2 ranks): an HF
Llama built from a config (or, without transformers, a small embedding + layers + head) with
AdamW, fully_shard on each decoder layer and the root, one step recorded (its compute times then
fixed: fixed_compute_times). Then, as a user would:
tune under a memory cap with the fsdp2 preset, export the tuned policy, apply it to a fresh FSDP2
model, read FSDP2's own prefetch lists and reshard settings back from the live modules, write them
in the exported form and import that (`fsdplab import-policy`). Checked:
- no module's FSDP2 list names the module itself, and FSDP2 holds exactly the exported lists;
- what FSDP2 holds, read back, is the tuned policy, and it simulates to the tuned step time, so
  the gain tune printed against FSDP2's default is the gain the export delivers;
- the tuned policy keeps the trace's optimizer (meta.optimizer adam) and fits the cap when
  simulated on its own, on the CPU trace's memory model (the tensors' bytes)."""

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

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch, torch.nn as nn, torch.distributed as dist
    sys.path.insert(0, sys.argv[1])
    import fsdplab.torch as fsdplab_torch
    rank, world, store, tmp, phase = (int(sys.argv[2]), int(sys.argv[3]), sys.argv[4],
                                      sys.argv[5], sys.argv[6])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
    from torch.distributed.fsdp import fully_shard

    def build():
        torch.manual_seed(0)
        try:
            from transformers import LlamaConfig, LlamaForCausalLM
            cfg = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=384,
                              num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                              max_position_embeddings=128)
            m = LlamaForCausalLM(cfg)
            layers = m.model.layers
        except ImportError:
            class Block(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc1, self.fc2 = nn.Linear(128, 384), nn.Linear(384, 128)
                def forward(self, x):
                    return x + self.fc2(torch.relu(self.fc1(x)))
            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.embed = nn.Embedding(512, 128)
                    self.layers = nn.ModuleList([Block() for _ in range(4)])
                    self.head = nn.Linear(128, 512)
                def forward(self, input_ids):
                    h = self.embed(input_ids)
                    for layer in self.layers:
                        h = layer(h)
                    return self.head(h)
            m = Net()
            layers = m.layers
        for layer in layers:
            fully_shard(layer)
        fully_shard(m)
        return m

    def logits(out):
        return out.logits if hasattr(out, "logits") else out

    torch.manual_seed(1)
    ids = torch.randint(0, 512, (4, 64))
    model = build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    def step():
        logits(model(input_ids=ids)).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    if phase == "record":
        step()  # lazy initialisation, the optimizer's state
        rec = fsdplab_torch.Recorder(model, optimizer=opt)
        with rec.step():
            step()
        rec.save(os.path.join(tmp, "trace.json"))
        rec.remove()
    else:
        notes = fsdplab_torch.apply_policy(model, os.path.join(tmp, "fsdp2.json"))
        step()
        # FSDP2's own settings, read back from the live modules.
        fqn_of = {}
        for name, m in model.named_modules():
            if hasattr(m, "_get_fsdp_state"):
                fqn_of[id(m._get_fsdp_state())] = name
        held = {}
        for name, m in model.named_modules():
            if not hasattr(m, "_get_fsdp_state"):
                continue
            st = m._get_fsdp_state()
            groups = getattr(st, "_fsdp_param_groups", None)
            if groups is None:
                g = getattr(st, "_fsdp_param_group", None)
                groups = [g] if g is not None else []
            held[name] = {
                "forward_prefetch": [fqn_of[id(s)] for s in st._states_to_forward_prefetch],
                "backward_prefetch": [fqn_of[id(s)] for s in st._states_to_backward_prefetch],
                "reshard_after_forward": any(g.post_forward_mesh_info is not None for g in groups),
            }
        if rank == 0:
            with open(os.path.join(tmp, "held.json"), "w", encoding="utf-8") as f:
                json.dump({"held": held, "notes": notes}, f)
    dist.destroy_process_group()
    """
)


def fsdp2_available():
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except Exception as e:  # torch 1.13 on Python 3.11 fails inside torch.distributed._shard
        return f"torch {torch.__version__}: no fully_shard ({type(e).__name__}: {e})"
    return None


# Every simulation's cluster: the two ranks, over a link as slow as makes a layer's all-gather
# take as long as its forward (fixed_compute_times): what the policy hides then shows in the step.
CLUSTER = ["--world-size", "2"]

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def fixed_compute_times(trace):
    """The recording's compute times, set to fixed ones: a decoder layer's forward 2,000 us and
    backward 4,000 us, every other compute 100 us. A CPU recorded on a loaded machine times each
    op differently run to run, and whether any prefetch helps (so whether there is a gain to
    check) turned on those times; the modules, parameters, memory and optimizer, which the
    export and its lists are about, stay as FSDP2 recorded them."""
    layers = {u["name"] for u in trace["units"] if u["parent"] is not None}
    for s in trace["steps"]:
        for mb in s["microbatches"]:
            for e in mb["events"]:
                if e["op"] != "compute":
                    continue
                if e.get("unit") in layers:
                    e["us"] = 2000.0 if e.get("phase") == "forward" else 4000.0
                else:
                    e["us"] = 100.0


def matched_bandwidth_gbps(trace):
    """Bus bandwidth (GB/s) at which a decoder layer's all-gather over 2 ranks takes as long as
    its mean recorded forward: (2-1)/2 x its unsharded bytes / that time."""
    layers = [u for u in trace["units"] if u["parent"] is not None]
    size = 0
    for p in layers[0]["params"]:
        n = 1
        for d in p["shape"]:
            n *= d
        size += n * DTYPE_BYTES[p["dtype"]]
    names = {u["name"] for u in layers}
    fwd = [e["us"] for s in trace["steps"] for mb in s["microbatches"] for e in mb["events"]
           if e["op"] == "compute" and e.get("phase") == "forward" and e.get("unit") in names]
    return 0.5 * size / (sum(fwd) / len(fwd)) / 1e3


def fsdplab(*args):
    if args[0] in ("simulate", "tune"):
        args = (*args, *CLUSTER)
    r = subprocess.run([FSDPLAB, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"fsdplab {' '.join(args)} failed ({r.returncode}): {r.stderr}")
    return r.stdout


def run_ranks(tmp, phase):
    store = os.path.join(tmp, f"store-{phase}")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SCRIPT, PYTHON_DIR, str(r), "2", store, tmp, phase],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    for p in procs:
        out, err = p.communicate(timeout=300)
        if p.returncode != 0:
            raise AssertionError(f"FSDP2 rank failed in {phase} ({p.returncode}): {err[-3000:]}")


class TuneFsdp2RoundTripTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        why = fsdp2_available()
        if why:
            raise unittest.SkipTest(why)
        if not FSDPLAB:
            raise AssertionError("FSDPLAB_BIN is not set (ctest sets it)")
        cls.tmp = tempfile.TemporaryDirectory()
        tmp = cls.tmp.name
        run_ranks(tmp, "record")
        with open(os.path.join(tmp, "trace.rank0.json"), encoding="utf-8") as f:
            trace = json.load(f)
        fixed_compute_times(trace)
        cls.trace = os.path.join(tmp, "trace.fixed.json")
        with open(cls.trace, "w", encoding="utf-8") as f:
            json.dump(trace, f)
        CLUSTER.extend(["--intra-bw", f"{matched_bandwidth_gbps(trace):.6g}"])
        # The cap: halfway between what FSDP2's default holds and what two modules ahead each way
        # with every module kept after forward hold (the CPU trace: the tensors' bytes).
        def held(*flags):
            rep = json.loads(fsdplab("simulate", cls.trace, "--allocator", "exact", "--json",
                                     *flags))
            return rep["summary"]["peak_memory_bytes"], rep["summary"]["step_time_us"]
        cls.default_peak, cls.default_step = held("--preset", "fsdp2")
        most, _ = held("--preset", "fsdp2", "--forward-prefetch", "2", "--backward-prefetch", "2",
                       "--reshard-after-forward", "false")
        cls.cap = (cls.default_peak + most) // 2
        cls.tuned = os.path.join(tmp, "tuned.json")
        cls.result = json.loads(fsdplab("tune", cls.trace, "--preset", "fsdp2", "--memory-cap",
                                        str(cls.cap), "--time-limit", "5", "--json", "--out",
                                        cls.tuned))
        fsdplab("export-policy", cls.tuned, "--trace", cls.trace, "--to", "fsdp2", "-o",
                os.path.join(tmp, "fsdp2.json"))
        run_ranks(tmp, "apply")
        with open(os.path.join(tmp, "fsdp2.json"), encoding="utf-8") as f:
            cls.exported = json.load(f)
        with open(os.path.join(tmp, "held.json"), encoding="utf-8") as f:
            cls.held = json.load(f)["held"]

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_the_trace_is_a_cpu_adam_run_and_tune_held_it_so(self):
        with open(self.trace, encoding="utf-8") as f:
            meta = json.load(f)["meta"]
        self.assertEqual(meta["optimizer"], "adam")
        self.assertIn("CPU", self.result["memory_model"])
        self.assertEqual(self.result["best"]["policy"]["optimizer"], "adam")
        self.assertEqual(self.result["framework"], "fsdp2")

    def test_no_module_lists_itself_and_fsdp2_holds_the_exported_lists(self):
        for m in self.exported["modules"]:
            live = self.held[m["fqn"]]
            for key in ("forward_prefetch", "backward_prefetch"):
                self.assertNotIn(m["fqn"], live[key], f"{m['fqn']!r} {key}")
                if key in m:
                    self.assertEqual(live[key], m[key], f"{m['fqn']!r} {key}")
            self.assertEqual(live["reshard_after_forward"], m["reshard_after_forward"], m["fqn"])

    def test_what_fsdp2_holds_is_the_tuned_policy_and_simulates_to_its_gain(self):
        # FSDP2's settings, in the exported form, read back as a policy.
        live = dict(self.exported)
        live["modules"] = []
        for m in self.exported["modules"]:
            held = self.held[m["fqn"]]
            live["modules"].append(
                {"fqn": m["fqn"], "unit": m["unit"], **{k: held[k] for k in held if k in m}}
            )
        live_path = os.path.join(self.tmp.name, "live.json")
        ran_path = os.path.join(self.tmp.name, "ran.json")
        with open(live_path, "w", encoding="utf-8") as f:
            json.dump(live, f)
        fsdplab("import-policy", live_path, "--trace", self.trace, "-o", ran_path)
        with open(ran_path, encoding="utf-8") as f, open(self.tuned, encoding="utf-8") as g:
            self.assertEqual(json.load(f), json.load(g))
        rep = json.loads(fsdplab("simulate", self.trace, "--policy", ran_path, "--allocator",
                                 "exact", "--memory-cap", str(self.cap), "--json"))
        step = rep["summary"]["step_time_us"]
        self.assertEqual(step, self.result["best"]["step_time_us"])
        default = self.result["preset_default"]["step_time_us"]
        self.assertEqual(default, self.default_step)
        printed = 100.0 * (self.result["best"]["step_time_us"] - default) / default
        delivered = 100.0 * (step - default) / default
        self.assertAlmostEqual(printed, delivered, places=9)
        self.assertLess(step, default)  # there is a gain to deliver
        print(f"\nFSDP2 default {default:.0f} us, tuned {step:.0f} us ({delivered:+.1f}%), "
              f"cap {self.cap} B", file=sys.stderr)

    def test_the_tuned_policy_fits_the_cap_with_the_traces_optimizer(self):
        rep = json.loads(fsdplab("simulate", self.trace, "--policy", self.tuned, "--allocator",
                                 "exact", "--memory-cap", str(self.cap), "--json"))
        self.assertEqual(rep["errors"], [])
        self.assertEqual(rep["summary"]["step_time_us"], self.result["best"]["step_time_us"])
        self.assertLessEqual(rep["summary"]["peak_memory_bytes"], self.cap)
        # The optimizer's state is in that peak: without it the peak is lower.
        plain = json.loads(fsdplab("simulate", self.trace, "--policy", self.tuned, "--allocator",
                                   "exact", "--optimizer", "none", "--json"))
        self.assertLess(plain["summary"]["peak_memory_bytes"], rep["summary"]["peak_memory_bytes"])


if __name__ == "__main__":
    unittest.main()
