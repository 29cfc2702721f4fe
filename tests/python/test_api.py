"""Tests of the fsdplab Python package against the fsdplab command installed beside it.

Run by scripts/test.sh with pytest in a virtual environment where `pip install .` put both the
package and the command (on that environment's PATH): every function's result must be the
command's JSON for the same inputs, field for field, and its errors the command's messages.
"""

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import fsdplab

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TRACES = os.path.join(ROOT, "traces")
BIN = os.environ.get("FSDPLAB_BIN") or os.path.join(os.path.dirname(sys.executable), "fsdplab")
SAMPLES = sorted(f for f in os.listdir(TRACES) if f.endswith(".json"))


def cli(*args, check_codes=(0,)):
    r = subprocess.run([BIN, *args], capture_output=True, text=True)
    if r.returncode not in check_codes:
        raise AssertionError(f"fsdplab {' '.join(args)}: exit {r.returncode}: {r.stderr}")
    return r


def cli_json(*args, check_codes=(0,)):
    return json.loads(cli(*args, check_codes=check_codes).stdout)


def load(name):
    with open(os.path.join(TRACES, name)) as f:
        return json.load(f)


def cli_error(*args):
    """The message `fsdplab` prints for an error: 'fsdplab CMD: MESSAGE' -> MESSAGE."""
    r = cli(*args, check_codes=(1, 2, 3))
    first = r.stderr.splitlines()[0]
    return r.returncode, first.split(": ", 1)[1]


def assert_same_json(test, got, expected, where="result"):
    """got == expected as JSON: the same types (an int is not a float, True is not 1) and every
    dict's keys in the same order, not only equal values."""
    test.assertIs(type(got), type(expected), f"{where}: {got!r} against {expected!r}")
    if isinstance(expected, dict):
        test.assertEqual(list(got), list(expected), f"{where}: the keys")
        for key, value in expected.items():
            assert_same_json(test, got[key], value, f"{where}[{key!r}]")
    elif isinstance(expected, list):
        test.assertEqual(len(got), len(expected), f"{where}: the length")
        for i, (g, e) in enumerate(zip(got, expected)):
            assert_same_json(test, g, e, f"{where}[{i}]")
    else:
        test.assertEqual(got, expected, where)


def simulate_or_failed(*args, **kwargs):
    """simulate()'s report, also when the step fails (StepFailed carries it)."""
    try:
        return fsdplab.simulate(*args, **kwargs), 0
    except fsdplab.StepFailed as e:
        return e.result, 3


class CommandInstalled(unittest.TestCase):
    def test_command_is_on_the_environments_path(self):
        self.assertTrue(os.access(BIN, os.X_OK), BIN)
        r = cli("--help")
        self.assertIn("usage: fsdplab <command>", r.stdout)

    def test_stubs_cover_every_binding(self):
        # The extension module's stubs (nanobind's stubgen) ship beside it and name every
        # function the module defines; the package's own functions are annotated.
        pkg = os.path.dirname(fsdplab.__file__)
        with open(os.path.join(pkg, "_fsdplab.pyi")) as f:
            stubs = f.read()
        names = [n for n in dir(fsdplab._fsdplab) if not n.startswith("_")]
        self.assertGreaterEqual(len(names), 10)
        for n in names:
            self.assertIn(f"def {n}(", stubs)
        self.assertTrue(os.path.exists(os.path.join(pkg, "py.typed")))
        for n in ("simulate", "sweep", "tune", "cost", "calibrate", "validate", "import_kineto",
                  "export_policy", "synth"):
            self.assertIn("return", getattr(fsdplab, n).__annotations__, n)


class SimulateEqualsCommand(unittest.TestCase):
    """simulate() on a path and on a dict == `fsdplab simulate --json`, for every sample."""

    def test_every_sample_by_path_and_by_dict(self):
        for name in SAMPLES:
            with self.subTest(trace=name):
                path = os.path.join(TRACES, name)
                r = cli("simulate", path, "--json", check_codes=(0, 3))
                expected = json.loads(r.stdout)
                got, code = simulate_or_failed(path)
                self.assertEqual(code, r.returncode)
                assert_same_json(self, got, expected)
                # A dict (what Recorder.trace() returns): the same report, no file involved.
                got, code = simulate_or_failed(load(name))
                self.assertEqual(code, r.returncode)
                assert_same_json(self, got, expected)

    def test_policy_cluster_and_engine_options_are_the_flags(self):
        # Policy keys, cluster keys and engine options by name mean what the flags mean.
        for name in ("gpt_small.json", "shared_layer.json", "two_microbatches.json"):
            with self.subTest(trace=name):
                path = os.path.join(TRACES, name)
                expected = cli_json("simulate", path, "--json", "--world-size", "16",
                                    "--gpus-per-node", "8", "--forward-prefetch", "2",
                                    "--backward-prefetch", "2", "--order", "recorded",
                                    "--memory-cap", "2G", "--steps", "3",
                                    "--straggler", "3:1.5", "--straggler", "5:1.2",
                                    check_codes=(0, 3))
                got, _ = simulate_or_failed(
                    load(name), policy={"forward_prefetch": 2, "backward_prefetch": 2,
                                        "order": "recorded"},
                    cluster={"world_size": 16, "gpus_per_node": 8}, memory_cap="2G", steps=3,
                    straggler=["3:1.5", "5:1.2"])
                self.assertEqual(got, expected)

    def test_preset_explain_and_jitter(self):
        path = os.path.join(TRACES, "gpt_small.json")
        expected = cli_json("simulate", path, "--json", "--preset", "fsdp2", "--memory-cap",
                            "2G", "--explain")
        self.assertEqual(fsdplab.simulate(path, preset="fsdp2", memory_cap=2 << 30,
                                          explain=True), expected)
        expected = cli_json("simulate", path, "--json", "--world-size", "1024",
                            "--rank-jitter", "0.05:1", "--prune-ranks")
        self.assertEqual(fsdplab.simulate(path, cluster={"world_size": 1024},
                                          rank_jitter="0.05:1", prune_ranks=True), expected)

    def test_policy_file_and_cluster_file(self):
        path = os.path.join(TRACES, "gpt_small.json")
        with tempfile.TemporaryDirectory() as d:
            pol = os.path.join(d, "p.json")
            with open(pol, "w") as f:
                json.dump({"forward_prefetch": 3, "reshard_after_forward": False}, f)
            clu = os.path.join(d, "c.json")
            with open(clu, "w") as f:
                json.dump({"world_size": 32, "gpus_per_node": 8,
                           "intra": {"bandwidth_GBps": 200, "latency_us": 5}}, f)
            expected = cli_json("simulate", path, "--json", "--policy", pol, "--cluster", clu)
            self.assertEqual(fsdplab.simulate(path, policy=pol, cluster=clu), expected)

    def test_per_rank_dicts_equal_rank_trace_files(self):
        base = load("gpt_small.json")
        with tempfile.TemporaryDirectory() as d:
            ranks, files = [], []
            for r in range(2):
                t = json.loads(json.dumps(base))
                t["meta"] = dict(t.get("meta", {}), rank=r, world_size=2)
                ranks.append(t)
                files.append(os.path.join(d, f"trace.rank{r}.json"))
                with open(files[-1], "w") as f:
                    json.dump(t, f)
            expected = cli_json("simulate", "--rank-trace", files[0], "--rank-trace", files[1],
                                "--json")
            self.assertEqual(fsdplab.simulate(ranks), expected)
            self.assertEqual(fsdplab.simulate(d), expected)  # the directory, as the command


class DictsAsJson(unittest.TestCase):
    """A dict given for a trace, policy or cluster reads as a file of the same content; what JSON
    cannot hold is refused naming where it is; results come back with JSON's types."""

    def simulate_file_and_dict(self, trace, **kwargs):
        """simulate() of `trace` as a dict and of the file json.dump writes of it: the command's
        exit code and report (or message) for both, and they must agree."""
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.json")
            with open(path, "w") as f:
                json.dump(trace, f)
            r = cli("simulate", path, "--json", check_codes=(0, 2, 3))
            if r.returncode == 2:
                with self.assertRaises(fsdplab.InvalidInput) as ctx:
                    fsdplab.simulate(trace, **kwargs)
                message = r.stderr.splitlines()[0].split(": ", 1)[1]
                # The file is named by its path, the dict is "trace".
                self.assertEqual(str(ctx.exception), message.replace(path, "trace"))
                return 2, str(ctx.exception)
            got, code = simulate_or_failed(trace, **kwargs)
            self.assertEqual(code, r.returncode)
            assert_same_json(self, got, json.loads(r.stdout))
            return code, got

    def test_large_ints_both_ways(self):
        # 2**62 saved bytes (beyond a double's 53 bits) go in exactly and the peaks that hold
        # them come back as exact ints; 2**64 + 5 fits no integer the reader takes, and the
        # dict gets the file's message.
        t = load("gpt_small.json")
        t["steps"][0]["microbatches"][0]["events"][1]["saved_bytes"] = 2**62
        code, report = self.simulate_file_and_dict(t)
        self.assertEqual(code, 0)
        peak = report["summary"]["peak_memory_bytes"]
        self.assertIs(type(peak), int)
        self.assertGreater(peak, 2**62)
        t["steps"][0]["microbatches"][0]["events"][1]["saved_bytes"] = 2**64 + 5
        code, message = self.simulate_file_and_dict(t)
        self.assertEqual(code, 2)
        self.assertIn("saved_bytes", message)

    def test_nested_empties_unicode_and_escapes(self):
        # Unit names with non-ASCII (one beyond the BMP), quotes, a backslash and a newline;
        # meta holding nested empty objects and lists and a unicode key.
        t = load("gpt_small.json")
        rename = {"model.layers.0": "model.слой.0", "model.layers.1": "model.層.1 😀",
                  "model.layers.2": 'model."q"\\b\n.2'}
        text = json.dumps(t)
        for old, new in rename.items():
            text = text.replace(json.dumps(old), json.dumps(new))
        t = json.loads(text)
        t["meta"]["ключ ☃"] = {"a": {}, "b": [], "c": [{}, [], [[]]], "d": ""}
        code, report = self.simulate_file_and_dict(t)
        self.assertEqual(code, 0)
        names = [u["unit"] for u in report["units"]]
        for new in rename.values():
            self.assertIn(new, names)
        self.assertEqual(fsdplab.validate(t), [])

    def test_what_json_cannot_hold_is_invalid_input_naming_where(self):
        path = os.path.join(TRACES, "gpt_small.json")
        t = load("gpt_small.json")
        t["steps"][0]["microbatches"][0]["events"][1]["us"] = float("nan")
        cases = [
            (lambda: fsdplab.simulate(t),
             'trace["steps"][0]["microbatches"][0]["events"][1]["us"]: float nan is not JSON'),
            (lambda: fsdplab.simulate([load("gpt_small.json"), t]),
             'trace[1]["steps"][0]["microbatches"][0]["events"][1]["us"]: float nan is not JSON'),
            (lambda: fsdplab.simulate(path, cluster={"world_size": 8,
                                                     "intra": {"bandwidth_GBps": -float("inf")}}),
             'cluster["intra"]["bandwidth_GBps"]: float -inf is not JSON'),
            (lambda: fsdplab.simulate(path, policy={"units": {"model": {2: 1}}}),
             'policy["units"]["model"]: a key of type int is not JSON (keys are strings)'),
            (lambda: fsdplab.validate(dict(load("gpt_small.json"), meta={"tags": {"a", "b"}})),
             'trace["meta"]["tags"]: a set is not JSON'),
            (lambda: fsdplab.export_policy({"forward_prefetch": 1.5 + 2j}, path),
             'policy["forward_prefetch"]: a complex is not JSON'),
        ]
        for call, message in cases:
            with self.subTest(message=message):
                with self.assertRaises(fsdplab.InvalidInput) as ctx:
                    call()
                self.assertEqual(str(ctx.exception), message)
        loop = []
        loop.append(loop)
        with self.assertRaises(fsdplab.InvalidInput) as ctx:
            fsdplab.simulate(path, policy={"x": loop})
        self.assertTrue(str(ctx.exception).startswith('policy["x"][0][0]'), str(ctx.exception))
        self.assertIn("nested more than 1000 levels deep", str(ctx.exception))
        self.assertLess(len(str(ctx.exception)), 200)  # the path is cut short

    def test_tuples_floats_and_bools_read_as_in_a_file(self):
        # A tuple is a JSON array, as json.dumps writes it; durations written as floats of
        # every form (1e-07, 50.0, 1e+16) time the step as the file does.
        t = load("gpt_small.json")
        t["units"][1]["params"][0]["shape"] = (1024,)
        events = t["steps"][0]["microbatches"][0]["events"]
        events[1]["us"] = 50.0
        events[3]["us"] = 1e-07
        code, _ = self.simulate_file_and_dict(t)
        self.assertEqual(code, 0)
        # Where the reader takes an integer, 8.5 and True are refused with the file's message.
        t["meta"]["world_size"] = 8.5
        code, message = self.simulate_file_and_dict(t)
        self.assertEqual((code, message), (2, "trace: meta.world_size: expected an integer, got 8.5"))
        t["meta"]["world_size"] = True
        code, _ = self.simulate_file_and_dict(t)
        self.assertEqual(code, 2)


class Errors(unittest.TestCase):
    def test_usage_errors_carry_the_commands_message(self):
        path = os.path.join(TRACES, "gpt_small.json")
        for flags, kwargs in [(["--steps", "0"], {"steps": 0}),
                              (["--memory-cap", "2X"], {"memory_cap": "2X"}),
                              (["--allocator", "foo"], {"allocator": "foo"}),
                              (["--preset", "nope"], {"preset": "nope"})]:
            with self.subTest(flags=flags):
                code, message = cli_error("simulate", path, *flags)
                exc = {1: fsdplab.UsageError, 2: fsdplab.InvalidInput}[code]
                with self.assertRaises(exc) as ctx:
                    fsdplab.simulate(path, **kwargs)
                self.assertIsInstance(ctx.exception, fsdplab.Error)
                self.assertEqual(str(ctx.exception), message)

    def test_a_bad_policy_dict_is_invalid_input_like_a_policy_file(self):
        path = os.path.join(TRACES, "gpt_small.json")
        with tempfile.TemporaryDirectory() as d:
            pol = os.path.join(d, "p.json")
            with open(pol, "w") as f:
                json.dump({"forward_prefetch": "x"}, f)
            code, message = cli_error("simulate", path, "--policy", pol)
        self.assertEqual(code, 2)
        with self.assertRaises(fsdplab.InvalidInput) as ctx:
            fsdplab.simulate(path, policy={"forward_prefetch": "x"})
        # The file is named by the command, the dict is "policy"; the problem is the same.
        self.assertEqual(str(ctx.exception), message.replace(f"--policy {pol}", "policy"))

    def test_invalid_trace_is_invalid_input_naming_the_problem(self):
        bad = os.path.join(ROOT, "tests", "data", "traces_bad", "unknown_unit.json")
        code, message = cli_error("simulate", bad)
        self.assertEqual(code, 2)
        with self.assertRaises(fsdplab.InvalidInput) as ctx:
            fsdplab.simulate(bad)
        self.assertEqual(str(ctx.exception), message)
        with open(bad) as f:
            doc = json.load(f)
        with self.assertRaises(fsdplab.InvalidInput) as ctx:
            fsdplab.simulate(doc)
        self.assertIn("unknown unit", str(ctx.exception))
        with self.assertRaises(fsdplab.InvalidInput):
            fsdplab.simulate(os.path.join(TRACES, "missing.json"))

    def test_failed_step_raises_with_the_report(self):
        # mxfp8_inside_recompute fails by design (exit 3, report still written).
        path = os.path.join(TRACES, "mxfp8_inside_recompute.json")
        code, message = cli_error("simulate", path, "--json")
        self.assertEqual(code, 3)
        with self.assertRaises(fsdplab.StepFailed) as ctx:
            fsdplab.simulate(path)
        self.assertEqual(str(ctx.exception), message)
        self.assertEqual(ctx.exception.result["format"], "fsdplab.report")

    def test_unknown_keyword_is_a_type_error(self):
        with self.assertRaises(TypeError):
            fsdplab.simulate(os.path.join(TRACES, "gpt_small.json"), memory_capp="2G")

    def test_nothing_on_stdout(self):
        code = ("import fsdplab; fsdplab.simulate(%r, explain=True); "
                "fsdplab.sweep(%r, {'forward_prefetch': [0, 1]}); fsdplab.synth(layers=2)"
                % ((os.path.join(TRACES, "gpt_small.json"),) * 2))
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, "")

    def test_gil_released_while_simulating(self):
        # A 4,096-rank jittered run takes a while; a Python thread counting beside it must
        # advance while it runs (it could not if the simulation held the GIL).
        path = os.path.join(TRACES, "gpt_small.json")
        done = threading.Event()
        ticks = []

        def count():
            while not done.is_set():
                ticks.append(time.perf_counter())
                time.sleep(0.001)

        start = time.perf_counter()
        fsdplab.simulate(path, cluster={"world_size": 4096}, rank_jitter="0.05:1", steps=4)
        alone = time.perf_counter() - start
        t = threading.Thread(target=count)
        t.start()
        start = time.perf_counter()
        fsdplab.simulate(path, cluster={"world_size": 4096}, rank_jitter="0.05:1", steps=4)
        end = time.perf_counter()
        done.set()
        t.join()
        during = [x for x in ticks if start < x < end]
        self.assertGreater(alone, 0.05, "the run is too short to tell")
        # A held GIL would give at most a tick or two (switch interval 5 ms at the ends).
        self.assertGreater(len(during), 5, (alone, len(during)))


class OtherFunctionsEqualCommands(unittest.TestCase):
    def test_sweep(self):
        path = os.path.join(TRACES, "gpt_small.json")
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "s.json")
            cli("sweep", path, "--forward-prefetch", "0,1,2", "--order", "registration,recorded",
                "--memory-cap", "1G", "-o", out)
            with open(out) as f:
                expected = json.load(f)
        got = fsdplab.sweep(path, {"forward_prefetch": [0, 1, 2],
                                   "order": ["registration", "recorded"]}, memory_cap="1G")
        self.assertEqual(got, expected)
        self.assertEqual(len(got["rows"]), 6)

    def test_sweep_nothing_under_the_cap_fails_with_the_table(self):
        path = os.path.join(TRACES, "gpt_small.json")
        cli("sweep", path, "--forward-prefetch", "0,1", "--memory-cap", "1K", check_codes=(3,))
        with self.assertRaises(fsdplab.StepFailed) as ctx:
            fsdplab.sweep(path, {"forward_prefetch": [0, 1]}, memory_cap="1K")
        self.assertIsNone(ctx.exception.result["chosen"])

    def test_tune(self):
        path = os.path.join(TRACES, "gpt_small.json")
        # gpt_small's search ends long before the time limit, so the command and the function
        # find the same: compare every field but the timings.
        timing = ("seconds", "policies_per_second")
        expected = cli_json("tune", path, "--memory-cap", "2G", "--preset", "fsdp2", "--json")
        got = fsdplab.tune(path, memory_cap="2G", preset="fsdp2")
        if expected["stop"] != "time_limit":
            self.assertEqual({k: v for k, v in got.items() if k not in timing},
                             {k: v for k, v in expected.items() if k not in timing})
        best, best_global = got["best"], got["global_best"]
        # The tuned policy is never slower than the best global one, and fits the cap.
        self.assertLessEqual(best["step_time_us"], best_global["step_time_us"] * (1 + 1e-12))
        self.assertLessEqual(best["held_bytes"], 2 << 30)
        with self.assertRaises(fsdplab.StepFailed) as ctx:
            fsdplab.tune(path, memory_cap="1K", time_limit_s=1)
        self.assertIsNone(ctx.exception.result["best"])
        with self.assertRaises(fsdplab.UsageError):
            fsdplab.tune(path, memory_cap="2G", preset="deepspeed-zero3")

    def test_cost(self):
        with tempfile.TemporaryDirectory() as d:
            clu = os.path.join(d, "c.json")
            with open(clu, "w") as f:
                json.dump({"world_size": 16, "gpus_per_node": 8}, f)
            expected = cli_json("cost", "--cluster", clu, "--collective", "all_gather",
                                "--bytes", "1M,64M,1G", "--world-size", "32", "--json")
            self.assertEqual(fsdplab.cost(clu, "all_gather", ["1M", 64 << 20, "1G"],
                                          world_size=32), expected)
        with self.assertRaises(fsdplab.UsageError):
            fsdplab.cost({"world_size": 16}, "broadcast", ["1M"])

    def test_calibrate(self):
        data = os.path.join(ROOT, "tests", "data", "nccl-tests")
        files = sorted(os.path.join(data, f) for f in os.listdir(data) if f.startswith("ag_8x"))
        self.assertTrue(files)
        for f in files:
            with self.subTest(file=os.path.basename(f)):
                r = cli("calibrate", f, "--json", check_codes=(0, 1, 2))
                if r.returncode == 0:
                    self.assertEqual(fsdplab.calibrate([f]), json.loads(r.stdout))
                else:
                    with self.assertRaises(fsdplab.Error):
                        fsdplab.calibrate([f])

    def test_validate(self):
        self.assertEqual(fsdplab.validate(os.path.join(TRACES, "gpt_small.json")), [])
        self.assertEqual(fsdplab.validate(load("gpt_small.json")), [])
        bad_dir = os.path.join(ROOT, "tests", "data", "traces_bad")
        bad = sorted(os.path.join(bad_dir, f) for f in os.listdir(bad_dir) if f.endswith(".json"))
        expected = cli_json("validate", *bad, "--json", check_codes=(2,))
        for f, entry in zip(bad, expected["files"]):
            with self.subTest(file=os.path.basename(f)):
                self.assertTrue(entry["problems"])
                self.assertEqual(fsdplab.validate(f), entry["problems"])

    def test_synth(self):
        expected = json.loads(cli("synth", "--layers", "3", "--hidden", "256", "--ffn", "1024",
                                  "--heads", "4", "--kv-heads", "2", "--tie-embeddings").stdout)
        got = fsdplab.synth(layers=3, hidden=256, ffn=1024, heads=4, kv_heads=2,
                            tie_embeddings=True)
        self.assertEqual(got, expected)
        code, message = cli_error("synth", "--heads", "5", "--hidden", "256")
        with self.assertRaises(fsdplab.UsageError) as ctx:
            fsdplab.synth(heads=5, hidden=256)
        # The library names the field, the command its flag.
        self.assertEqual(str(ctx.exception).replace("heads", "--heads", 1), message)

    def test_export_policy(self):
        trace = os.path.join(TRACES, "gpt_small.json")
        policy = {"forward_prefetch": 2, "reshard_after_forward": False}
        with tempfile.TemporaryDirectory() as d:
            pol = os.path.join(d, "p.json")
            with open(pol, "w") as f:
                json.dump(policy, f)
            expected = cli_json("export-policy", pol, "--trace", trace, "--to", "fsdp2",
                                "--format", "json")
            script = cli("export-policy", pol, "--trace", trace, "--to", "fsdp2").stdout
        self.assertEqual(fsdplab.export_policy(policy, trace, "fsdp2"), expected)
        self.assertEqual(fsdplab.export_policy(policy, load("gpt_small.json"), "fsdp2",
                                               format="python"), script)

    def test_import_kineto(self):
        # One root unit on the CPU (tests/kineto/kineto_test.cc, OneUnitEvents): hooks, an
        # all-gather, forward, loss, backward, the reduce-scatter and the optimizer.
        def x(cat, name, ts, dur, args=None):
            e = {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}
            if args:
                e["args"] = args
            return e

        ann = lambda n, ts, dur: x("user_annotation", n, ts, dur)  # noqa: E731
        op = lambda n, ts, dur, args=None: x("cpu_op", n, ts, dur, args)  # noqa: E731
        events = [
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}},
            ann("ProfilerStep#5", 0, 1000), ann("FSDP::pre_forward", 10, 10),
            ann("FSDP::all_gather", 11, 8),
            op("fsdp::all_gather_copy_in", 12, 1,
               {"Input Dims": [[[3], [1]], [8], [], [], []],
                "Input type": ["TensorList", "float", "ScalarList", "Scalar", "Scalar"],
                "Concrete Inputs": ["", "", "[6, 2]", "8", "0"]}),
            op("c10d::_allgather_base_", 14, 4,
               {"Input Dims": [[16], [8], [], [], []],
                "Input type": ["float", "float", "", "Scalar", "Scalar"]}),
            op("aten::linear", 30, 50), ann("FSDP::post_forward", 100, 5),
            op("aten::sum", 110, 10), ann("FSDP::pre_backward", 200, 10),
            op("autograd::engine::evaluate_function: AddmmBackward0", 220, 80),
            ann("FSDP::root_post_backward_callback", 400, 50),
            ann("FSDP::post_backward_reshard", 405, 5),
            ann("FSDP::post_backward_reduce", 410, 30),
            op("c10d::_reduce_scatter_base_", 415, 20,
               {"Input Dims": [[8], [16], [], [], []],
                "Input type": ["float", "float", "", "", "Scalar"]}),
            op("aten::add_", 500, 30)]
        profile = {"schemaVersion": 1,
                   "distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 2},
                   "record_shapes": 1, "traceEvents": events, "traceName": "t"}
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "p.json")
            with open(path, "w") as f:
                json.dump(profile, f)
            expected = cli_json("import-kineto", path)
            got = fsdplab.import_kineto(path)
        self.assertEqual(got, [expected])
        self.assertEqual([u["name"] for u in got[0]["units"]], ["model"])
        # The imported trace replays.
        self.assertEqual(fsdplab.validate(got[0]), [])
        with self.assertRaises(fsdplab.InvalidInput):
            fsdplab.import_kineto(os.path.join(d, "gone.json"))


class Example(unittest.TestCase):
    def test_example_records_simulates_and_picks(self):
        try:
            import torch  # noqa: F401
        except ImportError:
            self.fail("the example needs torch: run this suite where torch is installed")
        example = os.path.join(ROOT, "python", "examples", "pick_policy.py")
        r = subprocess.run([sys.executable, example], capture_output=True, text=True,
                           timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        # One line per policy (three), then the pick.
        self.assertEqual(len([ln for ln in lines if ln.startswith("forward_prefetch=")]), 3)
        self.assertTrue(lines[-1].startswith("best under"), r.stdout)


if __name__ == "__main__":
    unittest.main()
