"""The host prediction grid's diagnosis of a workload (bench/host_prediction_grid.py): how fast
its live collectives that overlapped no other collective ran against the calibrated curve; and
how long it measures a workload (steps per live run, calls per bench size); and which workloads
it measures again, and what it makes of the second measurement; which beside bench files
a calibration pools; which live steps ran slow per collective kind; and the working set each
workload's benches walk.

Needs only the fsdplab binary (FSDPLAB_BIN), for `fsdplab cost`; no torch.
"""
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import host_prediction_grid as grid  # noqa: E402

FSDPLAB = os.environ.get("FSDPLAB_BIN", "fsdplab")


def op(kind, start, dur, nbytes, step=1, rank=0):
    return {"kind": kind, "unit": "model.layers.0", "phase": "forward", "step": step,
            "microbatch": 0, "start_us": start, "dur_us": dur, "bytes": nbytes, "rank": rank}


class AloneRatiosTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        d = self.dir.name
        # A line model, 1 GB/s and 10 us per ring step: on 2 ranks a collective of B bytes costs
        # (2-1) x 10 + (2-1)/2 x B / 1000 us, so 1,000,000 B -> 510 us and 2,000,000 B -> 1010 us.
        self.cluster = os.path.join(d, "cluster.json")
        with open(self.cluster, "w") as fh:
            json.dump({"world_size": 2, "gpus_per_node": 2,
                       "intra": {"bandwidth_GBps": 1, "latency_us": 10},
                       "inter": {"bandwidth_GBps": 1, "latency_us": 10}}, fh)
        self.measured = os.path.join(d, "measured.json")

    def tearDown(self):
        self.dir.cleanup()

    def ratios(self, ops):
        with open(self.measured, "w") as fh:
            json.dump({"ops": ops}, fh)
        return grid.alone_ratios(FSDPLAB, self.cluster, 2, self.measured)

    def test_alone_calls_against_the_curve_and_overlapped_ones_left_out(self):
        got = self.ratios([
            # Alone: 255 / 510 = 0.5 and 1010 / 1010 = 1.0 -> median 0.75 over 2 calls.
            op("all_gather", 0, 255, 1000000),
            op("all_gather", 1000, 1010, 2000000),
            # These two overlap each other (3000-3510 and 3400-3910): neither is alone.
            op("all_gather", 3000, 510, 1000000),
            op("reduce_scatter", 3400, 510, 1000000),
            # Alone: 765 / 510 = 1.5.
            op("reduce_scatter", 5000, 765, 1000000),
            # Not counted: the warm-up step, another rank, a compute (which may overlap freely).
            op("all_gather", 7000, 5100, 1000000, step=0),
            op("all_gather", 20000, 5100, 1000000, rank=1),
            op("compute", 5100, 100, 0),
        ])
        self.assertAlmostEqual(got["all_gather"][0], 0.75, places=6)
        self.assertEqual(got["all_gather"][1], 2)
        self.assertAlmostEqual(got["reduce_scatter"][0], 1.5, places=6)
        self.assertEqual(got["reduce_scatter"][1], 1)

    def test_no_alone_call_no_entry(self):
        got = self.ratios([op("all_gather", 0, 510, 1000000),
                           op("reduce_scatter", 100, 510, 1000000)])
        self.assertEqual(got, {})


class ShapeForTest(unittest.TestCase):
    # The layer sizes come from fsdplab itself (simulate --json), not from a copy of its rules.
    def test_bf16_layer_nearest_two_mib(self):
        # hidden 256, ffn 1024: q, k, v, o (4 x 256 x 256) and gate, up, down (3 x 256 x 1024)
        # and two norms (2 x 256), 2 bytes each: 2 x 1049088 = 2098176 B, 0.05% above 2 MiB.
        self.assertEqual(grid.shape_for(FSDPLAB, 2 * grid.MiB, "bf16"), (256, 1024, 2098176))

    def test_mxfp8_layer_counts_both_planes_and_their_scales(self):
        # hidden 320, ffn 640: projections 4 x 320 x 320 + 3 x 320 x 640 = 1024000 elements, one
        # byte each per plane plus one scale byte per 32 (32000), two planes: 2112000 B; the
        # bf16 norms 2 x 2 x 320 = 1280 B: 2113280 B.
        self.assertEqual(grid.shape_for(FSDPLAB, 2 * grid.MiB, "mxfp8"), (320, 640, 2113280))


class MeasurementLengthTest(unittest.TestCase):
    # RUN_SECONDS 2.5, MAX_STEPS 96, BENCH_LOOP_US 30000, MAX_BENCH_ITERS 100.
    def test_short_steps_get_a_run_of_at_least_the_window(self):
        # 50 ms steps: 1 warm-up + ceil(2.5e6 / 50e3) = 1 + 50 = 51 steps.
        self.assertEqual(grid.steps_for(50e3, 8), 51)
        # 60 ms: 1 + ceil(41.67) = 43.
        self.assertEqual(grid.steps_for(60e3, 8), 43)

    def test_run_length_stays_within_its_bounds(self):
        # 400 ms: 1 + ceil(6.25) = 8, the minimum; 500 ms: 1 + 5 = 6 -> 8; 10 ms: 251 -> 96.
        self.assertEqual(grid.steps_for(400e3, 8), 8)
        self.assertEqual(grid.steps_for(500e3, 8), 8)
        self.assertEqual(grid.steps_for(10e3, 8), 96)
        # A larger minimum wins over the window: 500 ms with --steps 12 -> 12.
        self.assertEqual(grid.steps_for(500e3, 12), 12)

    def test_bench_loops_last_at_least_30_ms(self):
        # 700 us calls: ceil(30000 / 700) = ceil(42.86) = 43 iterations.
        self.assertEqual(grid.bench_iters(700, 10), 43)
        # 5 ms calls: 6 -> the minimum 10; 100 us: 300 -> at most 100.
        self.assertEqual(grid.bench_iters(5000, 10), 10)
        self.assertEqual(grid.bench_iters(100, 10), 100)


class MeasuredAgainTest(unittest.TestCase):
    @staticmethod
    def result(name, beside, grid_error):
        # report()'s result: (name, beside error, grid-wide error, spread, ...).
        return (name, beside, grid_error, 0.03)

    def test_worst_three_by_the_beside_error_when_every_workload_has_one(self):
        # |beside|: a 2.0, b 9.5, c 4.0, d 12.1, e 3.0 -> d, b, c (a grid-wide -30% is ignored).
        results = [self.result("a", 2.0, -30.0), self.result("b", -9.5, 1.0),
                   self.result("c", 4.0, 2.0), self.result("d", -12.1, 3.0),
                   self.result("e", 3.0, 4.0)]
        self.assertEqual([r[0] for r in grid.worst_three(results)], ["d", "b", "c"])

    def test_worst_three_by_the_grid_error_where_one_has_no_beside(self):
        # b has no beside prediction, so the grid-wide |error| ranks: a 30, e 4, d 3.
        results = [self.result("a", 2.0, -30.0), self.result("b", None, 1.0),
                   self.result("c", 4.0, 2.0), self.result("d", -12.1, 3.0),
                   self.result("e", 3.0, 4.0)]
        self.assertEqual([r[0] for r in grid.worst_three(results)], ["a", "e", "d"])

    def test_verdicts(self):
        # -16.4% then -14.7%, runs spreading 8.1%: 1.7 points apart, one sign, inside the spread.
        self.assertIn("came back", grid.again_verdict(-16.4, -14.7, 8.1))
        # -16.4% with runs spreading 17.1%: wider than the error itself.
        self.assertIn("cannot tell", grid.again_verdict(-16.4, -14.7, 17.1))
        # -14.6% then +0.5%, spread 3.7%: 15.1 points apart, and +0.5% is within 5%.
        self.assertIn("gone", grid.again_verdict(-14.6, 0.5, 3.7))
        # -14.6% then -9.0%, spread 3.0%: 5.6 points apart and still over 5%.
        self.assertIn("moved", grid.again_verdict(-14.6, -9.0, 3.0))
        # -8.0% then +2.0%, spread 6.0%: 10 points apart across zero, +2.0% within 5%: gone.
        self.assertIn("gone", grid.again_verdict(-8.0, 2.0, 6.0))
        # -8.0% then +6.0%, spread 7.9%: 14 points apart across zero, +6.0% over 5%: moved.
        self.assertIn("moved", grid.again_verdict(-8.0, 6.0, 7.9))

    def test_runs_of_orders_the_runs_and_reads_the_median(self):
        with tempfile.TemporaryDirectory() as d:
            # Step times 300, 100, 200 us: fastest first 100 (meas1), 200 (meas2), 300 (meas0);
            # the median is meas2, whose 5 steps are the workload's.
            for r, (t, steps) in enumerate([(300, 4), (100, 6), (200, 5)]):
                with open(os.path.join(d, f"w.meas{r}.json"), "w") as fh:
                    json.dump({"summary": {"step_time_us": t}, "steps": [{}] * steps}, fh)
            runs, median, steps = grid.runs_of(d, "w", 3)
            self.assertEqual([t for t, _ in runs], [100, 200, 300])
            self.assertEqual(os.path.basename(median), "w.meas2.json")
            self.assertEqual(steps, 5)


class SlowStepsTest(unittest.TestCase):
    @staticmethod
    def step(ag, rs):
        return {"allgather": {"busy_us": ag}, "reduce_scatter": {"busy_us": rs}}

    def test_slow_steps_per_kind_against_each_runs_median(self):
        with tempfile.TemporaryDirectory() as d:
            # Run 0: a warm-up step (left out, however slow) and 9 steps. All-gather busy 100
            # except one step of 140 (median 100; 140 > 1.3 x 100); reduce-scatter 200 except
            # steps of 270 and 261 (median 200; 270 > 260 and 261 > 260) and one of 259 (not
            # over). The step 140 / 270 is both, 100 / 261 reduce-scatter only, 100 / 259
            # neither: 9 steps, 1 reduce-scatter only, 0 all-gather only, 1 both.
            run0 = [self.step(900, 900)] + [self.step(100, 200)] * 6 + [
                self.step(140, 270), self.step(100, 261), self.step(100, 259)]
            # Run 1: 8 steps, all-gather 131 once (> 130: all-gather only), else 100 / 200.
            run1 = [self.step(900, 900)] + [self.step(100, 200)] * 7 + [self.step(131, 200)]
            # Run 2: 7 steps after the warm-up, under the 8 a slow step needs: left out.
            run2 = [self.step(900, 900)] + [self.step(100, 500)] * 7
            for r, steps in enumerate([run0, run1, run2]):
                with open(os.path.join(d, f"w.meas{r}.json"), "w") as fh:
                    json.dump({"steps": steps}, fh)
            # 9 + 8 steps; reduce-scatter only 1, all-gather only 1, both 1.
            self.assertEqual(grid.slow_steps(d, ["w"], 3), (17, 1, 1, 1))


class BenchTagsTest(unittest.TestCase):
    def test_tags_in_measured_order_only_of_that_workload_and_op(self):
        with tempfile.TemporaryDirectory() as d:
            # Tags 0-3 of w's all-gather written out of order, plus 10 (sorted as a number, not
            # as text: 0, 1, 2, 3, 10), and files that must not be picked: another op, a
            # second measurement (w.again), another workload whose name starts with w's.
            names = ["w.all_gather.2.txt", "w.all_gather.0.txt", "w.all_gather.10.txt",
                     "w.all_gather.3.txt", "w.all_gather.1.txt", "w.reduce_scatter.0.txt",
                     "w.again.all_gather.0.txt", "w1.all_gather.0.txt", "w.all_gather.x.txt"]
            for n in names:
                open(os.path.join(d, n), "w").close()
            got = [os.path.basename(p) for p in grid.bench_tags(d, "w", "all_gather")]
            self.assertEqual(got, ["w.all_gather.0.txt", "w.all_gather.1.txt",
                                   "w.all_gather.2.txt", "w.all_gather.3.txt",
                                   "w.all_gather.10.txt"])
            self.assertEqual([os.path.basename(p)
                              for p in grid.bench_tags(d, "w.again", "all_gather")],
                             ["w.again.all_gather.0.txt"])


if __name__ == "__main__":
    unittest.main()


class WorkingSetTest(unittest.TestCase):
    # scripts/cold_working_set.sh with a workload's collective footprint: the footprint rounded
    # up to MiB, at most the machine's cold size (8x its last-level cache, at least 256M, printed
    # without an argument).
    def test_footprint_up_to_the_cold_size(self):
        cold = int(grid.working_set().rstrip("M"))
        self.assertGreaterEqual(cold, 256)
        self.assertEqual(grid.working_set(1000), "1M")  # 1000 bytes: one MiB
        self.assertEqual(grid.working_set(0), "1M")
        self.assertEqual(grid.working_set(10 ** 12), f"{cold}M")  # 953674 MiB: over any cold size
        # gpt_small on 2 ranks walks 997306368 bytes: 951.1 MiB, rounded up to 952.
        self.assertEqual(grid.working_set(997306368), f"{min(952, cold)}M")
        self.assertEqual(grid.working_set(300 * 1048576), f"{min(300, cold)}M")
        self.assertEqual(grid.working_set(99 * 1048576 + 1), "100M")  # under any cold size
