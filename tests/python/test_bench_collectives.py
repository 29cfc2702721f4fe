"""`python -m fsdplab.torch.bench_collectives`: torch.distributed's all-gather and reduce-scatter
timed on 2 gloo ranks (torchrun, CPU, ~15 s), their rows turned into nccl-tests text and a
cluster file by `fsdplab bench-gather --rows` and `fsdplab calibrate`, which `simulate --cluster`
then reads. Asserts the sizes and the files' shapes, not the times (a bench's business).
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

FSDPLAB = os.environ.get("FSDPLAB_BIN", "")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
PYTHON_DIR = os.environ.get("FSDPLAB_PYTHON_DIR", os.path.join(ROOT, "python"))
sys.path.insert(0, PYTHON_DIR)
import fsdplab.torch.bench_collectives as bench  # noqa: E402 (the source tree's package)


def rows(path):
    with open(path, encoding="utf-8") as f:
        return [tuple(float(x) for x in line.split()) for line in f if not line.startswith("#")]


class TraceSizesTest(unittest.TestCase):
    def test_a_trace_without_collectives_gives_its_units_padded_parameters(self):
        # traces/optimizer_step.json, 2 ranks, bf16: the root's embed.weight [32000, 1024]
        # (32000 rows split evenly) and final_norm.weight [1024]: (32,768,000 + 1,024) x 2 =
        # 65,538,048 bytes; a layer's 1024 + 3072x1024 + 1024x1024 + 1024 + 2 x 4096x1024 =
        # 12,584,960 elements, 25,169,920 bytes (both layers the same size).
        sizes = bench.trace_sizes(os.path.join(ROOT, "traces", "optimizer_step.json"), 2)
        self.assertEqual(sizes["all_gather"], [25_169_920, 65_538_048])
        self.assertEqual(sizes["reduce_scatter"], [25_169_920, 65_538_048])

    def test_a_trace_with_measured_collectives_gives_their_sizes(self):
        trace = {"steps": [{"microbatches": [{"events": [
            {"op": "collective", "kind": "all_gather", "unit": "a", "bytes": 4096,
             "start_us": 0, "end_us": 5},
            {"op": "collective", "kind": "all_gather", "unit": "b", "bytes": 4096,
             "start_us": 5, "end_us": 9},
            {"op": "collective", "kind": "reduce_scatter", "unit": "a", "bytes": 8192,
             "start_us": 9, "end_us": 20}]}]}]}
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(trace, f)
            self.assertEqual(bench.trace_sizes(path, 2),
                             {"all_gather": [4096], "reduce_scatter": [8192]})

    def test_sweep_sizes(self):
        self.assertEqual(bench.parse_size("64K"), 65536)
        self.assertEqual(bench.sweep_sizes(65536, 1 << 20, 4), [65536, 262144, 1 << 20])


class TorchrunTest(unittest.TestCase):
    def test_two_gloo_ranks_write_rows_and_a_cluster_simulate_reads(self):
        if not FSDPLAB or not os.access(FSDPLAB, os.X_OK):
            raise RuntimeError(f"FSDPLAB_BIN={FSDPLAB!r} is not an executable fsdplab binary")
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "calib")
            p = subprocess.run(
                [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                 "--standalone", "-m", "fsdplab.torch.bench_collectives", "--out", out, "-b", "64K", "-e", "1M", "-f", "4",
                 "-w", "1", "-n", "3", "--fsdplab", FSDPLAB],
                capture_output=True, text=True, timeout=300,
                env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": PYTHON_DIR})
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            # 64K, 256K, 1M: three sizes of each kind, each timed (> 0 us).
            for kind in ("all_gather", "reduce_scatter"):
                r = rows(os.path.join(out, f"{kind}.rows"))
                self.assertEqual([int(s) for s, _ in r], [65536, 262144, 1 << 20])
                self.assertTrue(all(us > 0 for _, us in r), r)
                self.assertTrue(os.path.exists(os.path.join(out, f"{kind}.txt")))
            cluster = os.path.join(out, "cluster.json")
            with open(cluster, encoding="utf-8") as f:
                doc = json.load(f)
            self.assertEqual(doc["world_size"], 2)
            s = subprocess.run([FSDPLAB, "simulate", os.path.join(ROOT, "traces",
                                                                  "optimizer_step.json"),
                                "--cluster", cluster, "--json"],
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(s.returncode, 0, s.stderr)
            report = json.loads(s.stdout)
            self.assertFalse(any("H100" in w for w in report.get("warnings", [])))


if __name__ == "__main__":
    unittest.main(verbosity=2)
