"""The FSDP2 grid at its CI size (bench/fsdp2_grid.py run --quick): real FSDP2 (torch 2.x, CPU,
gloo, 2 ranks), the encoder model, two configurations (plain; activation checkpointing with two
microbatches), each timed, recorded, profiled and memory-tracked, then predicted through the CLI.

Asserts only what is deterministic: every raw file exists and parses, every run's measured and
predicted fields are there, FSDPMemTracker's parameter and optimizer bytes are what the model's
shapes give (and what the simulator holds for them), and `regrade` reproduces the predictions
from the kept files. Timing accuracy is the bench's business (bench/fsdp2_grid.sh), not a
test's.
"""

import glob
import gzip
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

FSDPLAB = os.environ.get("FSDPLAB_BIN", "")
GRID = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench",
                    "fsdp2_grid.py")
sys.path.insert(0, os.path.dirname(GRID))
import fsdp2_grid  # noqa: E402 (beside the bench script)


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def shard_bytes(shape, world=2, itemsize=4):
    """FSDP2's shard of one fp32 parameter on each rank: dim 0 split into chunks of
    ceil(rows / world) rows, padded, so every rank holds the same bytes."""
    return math.ceil(shape[0] / world) * math.prod(shape[1:]) * itemsize


class Fsdp2GridQuickTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not FSDPLAB or not os.access(FSDPLAB, os.X_OK):
            raise RuntimeError(f"FSDPLAB_BIN={FSDPLAB!r} is not an executable fsdplab binary")
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = cls.tmp.name
        p = subprocess.run([sys.executable, GRID, "run", "--quick", "--out", cls.dir,
                            "--fsdplab", FSDPLAB], capture_output=True, text=True, timeout=900)
        if p.returncode != 0:
            raise AssertionError(f"fsdp2_grid run --quick failed ({p.returncode}):\n"
                                 f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        cls.summary = load(os.path.join(cls.dir, "summary.json"))
        cls.runs = {r["id"]: r for r in cls.summary["runs"]}

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_the_two_configurations_ran(self):
        self.assertEqual(sorted(self.runs), ["encoder-xs-ac0-mb1-rs1-default",
                                             "encoder-xs-ac1-mb2-rs1-default"])
        self.assertEqual(self.summary["format"], "fsdplab.fsdp2_grid")
        with open(os.path.join(self.dir, "table.txt"), encoding="utf-8") as f:
            table = f.read()
        for rid in self.runs:
            self.assertIn(rid, table)

    def test_raw_files_exist_and_parse(self):
        for rid in self.runs:
            run = os.path.join(self.dir, "runs", rid)
            for r in range(2):
                trace = load(os.path.join(run, "traces", f"trace.rank{r}.json"))
                self.assertEqual(trace["format"], "fsdplab.trace")
                self.assertEqual((trace["meta"]["device"], trace["meta"]["backend"]),
                                 ("cpu", "gloo"))
                self.assertEqual(trace["meta"]["optimizer"], "adam")
                profile = load(os.path.join(run, "profile", f"trace.rank{r}.json.gz"))
                self.assertTrue(any(e.get("name", "").startswith("ProfilerStep#")
                                    for e in profile["traceEvents"]))
                # The profiled steps were recorded too: the same steps, one trace per rank.
                recorded = load(os.path.join(run, "profile", "recorded", f"trace.rank{r}.json"))
                profiled = {e["name"] for e in profile["traceEvents"]
                            if e.get("name", "").startswith("ProfilerStep#")}
                self.assertEqual(len(recorded["steps"]), len(profiled))
                # The stack phase: a profile with FSDP2's Python frames, its steps recorded too.
                stack = load(os.path.join(run, "stack", f"trace.rank{r}.json.gz"))
                self.assertTrue(any(e.get("cat") == "python_function"
                                    and "fsdp/_fully_shard/" in e.get("name", "")
                                    for e in stack["traceEvents"]))
                recorded = load(os.path.join(run, "stack", "recorded", f"trace.rank{r}.json"))
                self.assertEqual(len(recorded["steps"]), 2)  # --quick: 2 profiled steps
                # One unrecorded step timed after each recorded one, in the recording pair.
                rec = load(os.path.join(run, f"record.rank{r}.json"))
                self.assertEqual(len(rec["between_us"]), len(rec["step_us"]))
                timed = load(os.path.join(run, f"timed0.rank{r}.json"))
                self.assertEqual(len(timed["step_us"]), 6)  # --quick: 6 timed steps
                # Pinned: one core per rank, one thread each.
                self.assertEqual((timed["threads"], timed["interop_threads"]), (1, 1))
                self.assertIsNotNone(timed["core"])
                imported = load(os.path.join(run, "pred", "imported", f"trace.rank{r}.json"))
                self.assertEqual(imported["format"], "fsdplab.trace")
            for name in ("recorder", "imported"):
                report = load(os.path.join(run, "pred", f"{name}.report.json"))
                self.assertEqual(report["format"], "fsdplab.report")
                self.assertEqual(report["policy"]["order"], "recorded")  # --preset fsdp2

    def test_every_run_has_measured_and_predicted_fields(self):
        for rid, r in self.runs.items():
            m = r["measured"]
            for key in ("median", "p90", "range_rel", "p90_p50", "fwd_bwd_us", "opt_us",
                        "compute_us", "exposed_comm_us", "peak_bytes", "profiled_wall_us",
                        "recorded_pair_us"):
                self.assertTrue(math.isfinite(m[key]), f"{rid} measured {key}: {m[key]}")
            self.assertGreater(m["median"], 0)
            self.assertGreater(m["exposed_comm_us"], 0)  # gloo: every collective blocks
            self.assertTrue(math.isfinite(r["recorder"]["pair_step_err"]), rid)
            for path in ("recorder", "imported"):
                p = r[path]
                for key in ("step_us", "exposed_comm_us", "compute_us", "peak_bytes", "step_err",
                            "peak_err"):
                    self.assertTrue(math.isfinite(p[key]), f"{rid} {path} {key}: {p[key]}")
                split = sum(p["split"].values())
                self.assertAlmostEqual(split, p["step_err"], places=9)
            self.assertTrue(any(a["ratio"] for a in r["agreement"]))
            self.assertTrue(r["agreement_same_run"])  # recorder and import on the same steps
            # With the Python frames, every unit and phase on both sides (none that one path
            # gives a compute and the other does not).
            self.assertTrue(r["agreement_stack"], rid)
            for a in r["agreement_stack"]:
                self.assertIsNotNone(a["ratio"], f"{rid} {a['unit']} {a['phase']}")

    def test_tracker_memory_is_the_models_shapes(self):
        # Sharded parameters: the sum over the model's parameters of one rank's padded fp32
        # shard; AdamW keeps two moments of each (exp_avg, exp_avg_sq) plus a scalar step per
        # parameter (4 bytes each, fp32). The simulator holds the same sharded parameters and
        # optimizer state (trace shapes x the same padding).
        for rid, r in self.runs.items():
            trace = load(os.path.join(self.dir, "runs", rid, "traces", "trace.rank0.json"))
            params = [p for u in trace["units"] for p in u["params"]]
            shapes = [p["shape"] for p in params]
            expected = sum(shard_bytes(s) for s in shapes)
            cats = r["measured"]["peak_by_category"]
            self.assertEqual(cats["Sharded Param"], expected, rid)
            self.assertEqual(cats["OptState"], 2 * expected + 4 * len(shapes), rid)
            for path in ("recorder", "imported"):
                sharded, predicted = r[path]["memory_groups"]["sharded params"]
                self.assertEqual(sharded, expected)
                self.assertEqual(predicted, expected, f"{rid} {path}")
            opt, predicted = r["recorder"]["memory_groups"]["optimizer state"]
            self.assertEqual(predicted, 2 * expected, rid)
            # The peak compared is the tracker's total on the larger rank: a sum of its
            # categories.
            self.assertEqual(r["measured"]["peak_bytes"],
                             sum(v for k, v in cats.items() if k != "Total"))

    def test_regrade_reproduces_the_predictions(self):
        before = {rid: (r["recorder"]["step_us"], r["recorder"]["peak_bytes"],
                        r["imported"]["step_us"], r["imported"]["peak_bytes"])
                  for rid, r in self.runs.items()}
        fsdp2_grid.grade(self.dir, FSDPLAB)
        after = {r["id"]: (r["recorder"]["step_us"], r["recorder"]["peak_bytes"],
                           r["imported"]["step_us"], r["imported"]["peak_bytes"])
                 for r in load(os.path.join(self.dir, "summary.json"))["runs"]}
        self.assertEqual(before, after)


if __name__ == "__main__":
    unittest.main()
