#!/usr/bin/env python3
"""The report page's size and time to draw (design §6.4; target: a 1,024-rank, 80-layer report
draws in under 2 s and its file stays under 20 MB).

Makes the pages with the built fsdplab, loads each in Debian's headless Chromium (the browser
tests' driver, tests/browser/browser_page.py) REPEATS times, network off, 1,280 px wide, and
prints its size and the median time from the start of the navigation until every chart was
drawn. Exits 1 when a page misses a target, when the browser reports an error, or when no
Chromium is installed (a benchmark that cannot run fails).

  python3 bench/report_page.py [BUILD_DIR] [REPEATS]
"""

import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "browser"))
import browser_page  # noqa: E402

MAX_MS = 2000
MAX_BYTES = 20 << 20


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build")
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    fsdplab = os.path.join(build, "tools", "fsdplab")
    if not browser_page.find_chromium():
        sys.exit("report_page: no headless Chromium: `bash scripts/setup.sh` installs it")
    traces = os.path.join(ROOT, "traces")
    failed = False
    with tempfile.TemporaryDirectory(prefix="fsdplab-page-bench-") as d:
        l80 = os.path.join(d, "l80.json")
        subprocess.run([fsdplab, "synth", "--layers", "80", "--hidden", "8192", "--ffn", "28672",
                        "--heads", "64", "--kv-heads", "8", "--vocab", "128256", "--world-size",
                        "1024", "-o", l80], check=True, capture_output=True)
        cases = [
            ("gpt_small, 8 ranks, --explain",
             [os.path.join(traces, "gpt_small.json"), "--explain"]),
            ("80 layers, 1,024 ranks with per-rank speeds (64 recorded)",
             [l80, "--world-size", "1024", "--rank-jitter", "0.05:1"]),
            ("80 layers, 1,024 ranks with per-rank speeds, --explain",
             [l80, "--world-size", "1024", "--rank-jitter", "0.05:1", "--explain"]),
        ]
        for name, args in cases:
            html = os.path.join(d, "page.html")
            start = time.monotonic()
            subprocess.run([fsdplab, "simulate", *args, "--html", html], check=True,
                           capture_output=True)
            made = time.monotonic() - start
            size = os.path.getsize(html)
            times = []
            for _ in range(repeats):
                page = browser_page.load(html)
                if page.errors or page.requests:
                    print("  %s: errors %s, requests %s" % (name, page.errors, page.requests))
                    failed = True
                times.append(page.facts["renderMs"])
            ms = statistics.median(times)
            ok = ms < MAX_MS and size < MAX_BYTES
            failed |= not ok
            print("%-58s %8.1f KiB  drawn in %6.0f ms (median of %d; %0.f-%0.f)  simulate + page "
                  "%.1f s  %s" % (name, size / 1024, ms, repeats, min(times), max(times), made,
                                  "ok" if ok else "MISSES THE TARGET"))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
