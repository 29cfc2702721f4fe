"""The report page (`fsdplab report`, `--html`) in a real browser: Debian's headless Chromium
loads each page from file:// with the network off, and each test checks that nothing failed,
nothing was fetched, the DOM holds the sections and numbers of the files the page was made from,
nothing sticks out at 1,280 px, and the screenshot shows paint across the sections' width.

Run one case: python3 test_report_page.py test_gpt_small (FSDPLAB_BIN, FSDPLAB_TRACES_DIR and
FSDPLAB_TEST_DATA_DIR come from CMake; screenshots go to FSDPLAB_BROWSER_OUT). Exit status 77
(CTest: skipped) when no Chromium is installed: `bash scripts/setup.sh` installs it.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

import browser_page

BIN = os.environ.get("FSDPLAB_BIN", "fsdplab")
TRACES = os.environ.get("FSDPLAB_TRACES_DIR", "traces")
DATA = os.environ.get("FSDPLAB_TEST_DATA_DIR", "tests/data")
OUT = os.environ.get("FSDPLAB_BROWSER_OUT", "")
ALL_SECTIONS = {"summary", "timeline", "memory", "units", "measured", "sweep", "calibration"}


def fsdplab(*args, cwd=None):
    r = subprocess.run([BIN, *args], cwd=cwd, capture_output=True, text=True, check=False)
    if r.returncode not in (0, 3):
        raise AssertionError("fsdplab %s: exit %d\n%s" % (" ".join(args), r.returncode, r.stderr))
    return r.stdout


def format_us(us):
    """The text report's FormatUs (report/src/report_output.cc): what the summary cell shows."""
    if us >= 1e6:
        return "%.3f s" % (us / 1e6)
    if us >= 1e3:
        return "%.3f ms" % (us / 1e3)
    return "%.1f us" % us


class ReportPageTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="fsdplab-page-")
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.dir, name)

    def load(self, html, sections):
        """Loads the page; checks what every page must hold; returns the Page."""
        size = os.path.getsize(html)
        self.assertLess(size, 20 << 20, "the page must stay under 20 MB")
        page = browser_page.load(html)
        name = self.id().rsplit(".", 1)[-1]
        if OUT:
            os.makedirs(OUT, exist_ok=True)
            shot = "%s.%s.png" % (name, os.path.splitext(os.path.basename(html))[0])
            with open(os.path.join(OUT, shot), "wb") as f:
                f.write(page.png)
        print("%s: %.1f KiB, drawn in %.0f ms" % (name, size / 1024, page.facts["renderMs"]))
        f = page.facts
        self.assertEqual(page.errors, [], "console errors")
        self.assertEqual(page.requests, [], "the page asked for something: it must be offline")
        drawn = {s["id"] for s in f["sections"]} & ALL_SECTIONS
        self.assertEqual(drawn, set(sections), "sections drawn")
        self.assertEqual(f["rendered"].split(), [s for s in
                         ["summary", "timeline", "memory", "units", "measured", "sweep",
                          "calibration"] if s in sections])
        # Nothing wider than the window, nothing cut off.
        self.assertLessEqual(f["scrollWidth"], f["innerWidth"])
        self.assertEqual(f["clipped"], [])
        # The screenshot painted: not blank, and paint reaches across the sections' width.
        shot = page.shot
        self.assertEqual(shot["width"], browser_page.WIDTH)
        self.assertGreater(shot["page"]["painted"], 0.02)
        self.assertGreater(shot["page"]["colours"], 20)
        left = min(s["left"] for s in f["sections"])
        right = max(s["right"] for s in f["sections"])
        self.assertGreaterEqual(shot["page"]["maxX"] - shot["page"]["minX"], 0.9 * (right - left))
        for canvas, stats in shot["regions"].items():
            self.assertGreater(stats["painted"], 0.01, "chart %s is blank" % canvas)
            self.assertGreaterEqual(stats["colours"], 3, "chart %s is blank" % canvas)
        return page

    def check_summary(self, page, report):
        f = page.facts
        s = report["summary"]["step_time_us"]
        self.assertEqual(f["stepTime"], s, "the summary's step time is the report's")
        self.assertEqual(f["stepTimeText"], format_us(s))

    def test_gpt_small(self):
        html, js = self.path("gpt_small.html"), self.path("gpt_small.json")
        fsdplab("simulate", os.path.join(TRACES, "gpt_small.json"), "--explain", "-o", js,
                "--html", html)
        report = json.load(open(js))
        page = self.load(html, ["summary", "timeline", "memory", "units"])
        self.check_summary(page, report)
        f = page.facts
        # gpt_small's 8 ranks run alike: one class, rank 0, whose computes and collectives are
        # the report's "ops"; --explain's path is drawn over them.
        self.assertEqual(len(report["timeline"]["ranks"]), 1)
        self.assertEqual(f["timelineOps"], len(report["ops"]))
        self.assertGreater(f["timelineExposed"], 0)
        self.assertGreater(f["timelinePath"], 0)
        # Every category with bytes at the peak is a layer of the memory plot; the peak is marked.
        at_peak = [c for c, b in report["summary"]["peak_memory_by_category"].items() if b > 0]
        self.assertGreaterEqual(f["memoryCategories"], len(at_peak))
        self.assertIn("peak", f["memoryMarks"])
        self.assertEqual(f["unitBars"], len(report["units"]))
        # Hovering the first all-gather names its unit, step, microbatch, bytes and reason (the
        # report's first all-gather of rank 0: its ops are the timeline's, in the same order).
        first = next(o for o in report["ops"] if o["kind"] == "all_gather")
        tip = "\n".join(page.interaction["tooltip"])
        self.assertIn("all_gather %s (%s)" % (first["unit"], first["phase"]), tip)
        self.assertIn("step %d, microbatch %d" % (first["step"], first["microbatch"]), tip)
        self.assertIn("issued: " + first["reason"], tip)
        self.assertIn("%.1f MiB" % (first["bytes"] / 2**20), tip)
        # The last step's button shows that step's window; sorting puts the most exposed first.
        last = report["steps"][-1]
        self.assertEqual(page.interaction["zoomed"], {"min": last["start_us"], "max": last["end_us"]})
        by_exposed = sorted(report["units"], key=lambda u: -u["exposed_us"])
        self.assertEqual([l.split(" (")[0] for l in page.interaction["unitsByExposed"]],
                         [u["unit"] for u in by_exposed])
        # The JSON written beside the page draws the same page.
        again = self.path("again.html")
        fsdplab("report", js, "-o", again)
        with open(html) as a, open(again) as b:
            strip = lambda t: re.sub(r"fsdplab (simulate|report) [^<\"]*", "", t)  # the titles
            self.assertEqual(strip(a.read()), strip(b.read()))

    def test_measured(self):
        trace = os.path.join(TRACES, "gpt_small.json")
        pred, meas, html = self.path("pred.json"), self.path("meas.json"), self.path("pm.html")
        fsdplab("simulate", trace, "--world-size", "2", "--steps", "3", "-o", pred)
        fsdplab("run", "--backend", "host", trace, "--world-size", "2", "--steps", "3",
                "--compute", "timed", "--no-check", "-o", meas, "--html", self.path("run.html"))
        fsdplab("report", pred, "--measured", meas, "-o", html)
        page = self.load(html, ["summary", "timeline", "units", "measured"])
        predicted, measured = json.load(open(pred)), json.load(open(meas))
        self.check_summary(page, predicted)
        rows = page.facts["measuredRows"]
        self.assertEqual([r["step"] for r in rows], [s["index"] for s in measured["steps"]])
        self.assertEqual([r["predicted"] for r in rows], [s["time_us"] for s in predicted["steps"]])
        self.assertEqual([r["measured"] for r in rows], [s["time_us"] for s in measured["steps"]])
        self.assertTrue(page.facts["compareVerdict"].startswith("verdict:"))
        # The live run's own page: its timeline and memory (the host executor records both).
        run_page = self.load(self.path("run.html"), ["summary", "timeline", "memory", "units"])
        self.check_summary(run_page, measured)

    def test_sweep(self):
        html, csv, js = self.path("sweep.html"), self.path("sweep.csv"), self.path("sweep.json")
        fsdplab("sweep", os.path.join(TRACES, "gpt_small.json"), "--forward-prefetch", "0,1,2,4",
                "--backward-prefetch", "0,1,2", "--steps", "3", "--memory-cap", "550M",
                "--csv", csv, "-o", js, "--html", html)
        # 4 x 3 policies; the fastest under 550 MiB is ringed; the chosen one's report beside.
        page = self.load(html, ["summary", "timeline", "memory", "units", "sweep"])
        f = page.facts
        policies = len(open(csv).read().strip().splitlines()) - 1
        self.assertEqual(policies, 12)
        self.assertEqual(f["sweepPoints"], policies)
        self.assertEqual(f["sweepRows"], policies)
        self.assertEqual(f["sweepChosen"], 1)
        self.assertIn("cap", f["memoryMarks"])
        sweep = json.load(open(js))
        chosen = sweep["rows"][sweep["chosen"]]
        self.assertEqual(f["stepTime"], chosen["step_time_us"])
        # The CSV draws the same points (`fsdplab report --sweep FILE.csv`).
        csv_html = self.path("csv.html")
        fsdplab("report", "--sweep", csv, "--memory-cap", "550M", "-o", csv_html)
        page = self.load(csv_html, ["sweep"])
        self.assertEqual(page.facts["sweepPoints"], policies)
        self.assertEqual(page.facts["sweepChosen"], 1)

    def test_tune(self):
        html = self.path("tune.html")
        out = fsdplab("tune", os.path.join(TRACES, "gpt_small.json"), "--memory-cap", "550M",
                      "--time-limit", "2", "--html", html)
        evaluated = int(re.match(r"(\d+) policies simulated", out).group(1))
        page = self.load(html, ["summary", "timeline", "memory", "units", "sweep"])
        f = page.facts
        self.assertEqual(f["sweepRows"], evaluated)
        # Every policy that ran is a point; one that fails is a row of the table only.
        self.assertEqual(f["sweepPoints"], evaluated - f["sweepFailed"])
        self.assertEqual(f["sweepChosen"], 1)

    def test_calibration(self):
        nccl = os.path.join(DATA, "nccl-tests")
        cal, html = self.path("cal.json"), self.path("cal.html")
        with open(cal, "w") as f:
            f.write(fsdplab("calibrate", os.path.join(nccl, "ag_8xH100_together-ring.txt"),
                            os.path.join(nccl, "rs_8xH100_together-ring.txt"), "--json"))
        fsdplab("report", "--calibration", cal, "-o", html)
        page = self.load(html, ["calibration"])
        fits = json.load(open(cal))["fits"]
        self.assertEqual(page.facts["calibrationCharts"], len(fits))
        self.assertEqual(page.facts["calibrationMeasured"], [len(f["points"]) for f in fits])

    def test_large(self):
        # 1,024 ranks of an 80-layer model with per-rank speeds: the page shows the ranks that
        # matter and stays small. (Its time to draw is printed, not held to a limit here.)
        trace, html, js = self.path("l80.json"), self.path("large.html"), self.path("large.json")
        subprocess.run([BIN, "synth", "--layers", "80", "--hidden", "8192", "--ffn", "28672",
                        "--heads", "64", "--kv-heads", "8", "--vocab", "128256", "--world-size",
                        "1024", "-o", trace], check=True, capture_output=True)
        fsdplab("simulate", trace, "--world-size", "1024", "--rank-jitter", "0.05:1", "-o", js,
                "--html", html)
        report = json.load(open(js))
        page = self.load(html, ["summary", "timeline", "memory", "units"])
        self.check_summary(page, report)
        ranks = report["timeline"]["ranks"]
        self.assertLessEqual(len(ranks), 6)
        whys = " ".join(w for r in ranks for w in r["why"])
        self.assertIn("slowest", whys)
        self.assertIn("fastest", whys)
        self.assertEqual(page.facts["unitBars"], len(report["units"]))


if __name__ == "__main__":
    if not browser_page.find_chromium():
        print("SKIPPED: no headless Chromium (chromium-headless-shell or chromium): "
              "`bash scripts/setup.sh` installs it")
        sys.exit(77)
    unittest.main(argv=sys.argv[:1] + ["ReportPageTest." + a for a in sys.argv[1:]], verbosity=2)
