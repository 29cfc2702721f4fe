"""Loads a report page in Debian's headless Chromium with the network off and says what it saw.

Chromium is driven over the DevTools protocol on a pipe (--remote-debugging-pipe: plain JSON
messages ending in NUL on file descriptors 3 and 4), so nothing beyond Python's standard library
is needed. `load(path)` returns a Page with the console errors, the requests the page tried, what
the DOM holds (the page's sections, numbers, chart points) and a screenshot's statistics, measured
by the browser itself decoding the PNG it took.
"""

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time

CHROMIUM_NAMES = ("chromium-headless-shell", "chromium", "chromium-browser")
WIDTH = 1280


def find_chromium():
    """The headless Chromium binary, or None (FSDPLAB_CHROMIUM overrides the search)."""
    env = os.environ.get("FSDPLAB_CHROMIUM")
    if env:
        return env if os.access(env, os.X_OK) else None
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


class Page:
    """What one load of a page showed."""

    def __init__(self):
        self.errors = []      # console errors, uncaught exceptions, browser log errors
        self.requests = []    # every URL the page asked for that is not the page itself
        self.facts = {}       # what the DOM held (FACTS below)
        self.shot = {}        # the screenshot's statistics (SHOT_STATS below)
        self.interaction = {}  # what hovering, zooming and sorting showed (INTERACT below)
        self.png = b""


# What the tests read from the DOM, as one JSON value.
FACTS = r"""
(() => {
  const num = (sel) => {
    const e = document.querySelector(sel);
    return e ? Number(e.getAttribute('data-value')) : null;
  };
  const txt = (sel) => {
    const e = document.querySelector(sel);
    return e ? e.textContent : null;
  };
  const sections = [...document.querySelectorAll('section[data-section]')].map((s) => {
    const r = s.getBoundingClientRect();
    return {id: s.id, left: r.left, right: r.right, top: r.top + scrollY, height: r.height};
  });
  const points = (id, role) => {
    const c = document.getElementById(id);
    const chart = c && Chart.getChart(c);
    if (!chart) return null;
    let n = 0;
    chart.data.datasets.forEach((ds, i) => {
      if (ds.fsdplabRole === role) n += chart.getDatasetMeta(i).data.length;
    });
    return n;
  };
  const canvases = [...document.querySelectorAll('canvas')].map((c) => {
    const r = c.getBoundingClientRect();
    return {id: c.id, x: r.left, y: r.top + scrollY, w: r.width, h: r.height};
  });
  // Text or boxes that stick out of the page or out of their own box: cut off at 1,280 px.
  const clipped = [...document.querySelectorAll('main *, header *')].filter((e) =>
    e.scrollWidth > e.clientWidth + 1 && getComputedStyle(e).overflowX === 'hidden' ||
    e.getBoundingClientRect().right > innerWidth + 0.5).map((e) => e.tagName + '#' + e.id);
  return {
    rendered: document.body.getAttribute('data-rendered'),
    renderMs: window.fsdplabPage ? window.fsdplabPage.renderMs : null,
    sections: sections,
    stepTime: num('#summary-step-time'),
    stepTimeText: txt('#summary-step-time'),
    verdict: txt('#verdict'),
    compareVerdict: txt('#compare-verdict'),
    timelineOps: points('timeline-chart', 'op'),
    timelineExposed: points('timeline-chart', 'exposed'),
    timelinePath: points('timeline-chart', 'path'),
    memoryCategories: (() => {
      const c = document.getElementById('memory-chart');
      const chart = c && Chart.getChart(c);
      return chart ? chart.data.datasets.filter((d) => d.fsdplabRole === 'category').length : null;
    })(),
    memoryMarks: ['cap', 'peak', 'late'].filter((role) => {
      const c = document.getElementById('memory-chart');
      const chart = c && Chart.getChart(c);
      return chart && chart.data.datasets.some((d) => d.fsdplabRole === role);
    }),
    unitBars: (() => {
      const c = document.getElementById('units-chart');
      const chart = c && Chart.getChart(c);
      return chart ? chart.data.labels.length : null;
    })(),
    sweepPoints: points('sweep-chart', 'policy'),
    sweepChosen: points('sweep-chart', 'chosen'),
    sweepRows: document.querySelectorAll('#sweep-table tbody tr').length,
    sweepFailed: [...document.querySelectorAll('#sweep-table tbody tr')].filter((tr) =>
      tr.lastChild.textContent.includes('fails:')).length,
    measuredRows: [...document.querySelectorAll('#measured-table tbody tr')].map((tr) => ({
      step: Number(tr.getAttribute('data-step')),
      predicted: Number(tr.querySelector('[data-key=predicted_us]').getAttribute('data-value')),
      measured: Number(tr.querySelector('[data-key=measured_us]').getAttribute('data-value'))})),
    calibrationCharts: document.querySelectorAll('#calibration canvas').length,
    calibrationMeasured: [...document.querySelectorAll('#calibration canvas')].map((c) =>
      Chart.getChart(c).data.datasets.filter((d) => d.fsdplabRole === 'measured')
        .reduce((n, d) => n + d.data.length, 0)),
    canvases: canvases,
    clipped: clipped,
    scrollWidth: document.documentElement.scrollWidth,
    innerWidth: innerWidth,
    height: document.documentElement.scrollHeight,
  };
})()
"""

# What a person does on the page: hover the first all-gather of the timeline (its tooltip's
# lines), zoom to the last step (the x axis's range after), sort the units by exposed time
# (their order after). Run after FACTS; it changes the page.
INTERACT = r"""
(() => {
  const out = {};
  const tl = Chart.getChart(document.getElementById('timeline-chart'));
  if (tl) {
    const ds = tl.data.datasets.findIndex((d) => d.label === 'all_gather');
    if (ds >= 0) {
      const el = tl.getDatasetMeta(ds).data[0];
      tl.tooltip.setActiveElements([{datasetIndex: ds, index: 0}], {x: el.x, y: el.y});
      tl.update();
      out.tooltip = tl.tooltip.body.flatMap((b) => b.lines);
    }
    const buttons = [...document.querySelectorAll('#timeline .controls button')];
    buttons[buttons.length - 1].click();
    out.zoomed = {min: tl.scales.x.min, max: tl.scales.x.max};
  }
  const units = document.getElementById('units-sort');
  if (units) {
    units.value = 'exposed';
    units.dispatchEvent(new Event('change'));
    out.unitsByExposed = Chart.getChart(document.getElementById('units-chart')).data.labels;
  }
  return out;
})()
"""

# Run on the screenshot in a blank tab: the browser decodes the PNG it took; per region (the
# whole page, each canvas) the share of pixels that are not the white background, how many
# colours a sample of them has, and how far across the page paint reaches.
SHOT_STATS = r"""
(async (png, regions) => {
  const img = new Image();
  img.src = 'data:image/png;base64,' + png;
  await img.decode();
  const c = document.createElement('canvas');
  c.width = img.width;
  c.height = img.height;
  const g = c.getContext('2d');
  g.drawImage(img, 0, 0);
  const data = g.getImageData(0, 0, c.width, c.height).data;
  const stats = (x0, y0, w, h) => {
    x0 = Math.max(0, Math.floor(x0)); y0 = Math.max(0, Math.floor(y0));
    const x1 = Math.min(c.width, Math.ceil(x0 + w)), y1 = Math.min(c.height, Math.ceil(y0 + h));
    let painted = 0, total = 0, minX = Infinity, maxX = -Infinity;
    const colours = new Set();
    for (let y = y0; y < y1; y += 2) {
      for (let x = x0; x < x1; x += 2) {
        const i = 4 * (y * c.width + x);
        const r = data[i], gr = data[i + 1], b = data[i + 2];
        ++total;
        if (r < 245 || gr < 245 || b < 245) {
          ++painted;
          if (x < minX) minX = x;
          if (x > maxX) maxX = x;
          if (colours.size < 512) colours.add((r << 16) | (gr << 8) | b);
        }
      }
    }
    return {painted: total ? painted / total : 0, colours: colours.size,
            minX: painted ? minX : null, maxX: painted ? maxX : null};
  };
  const out = {width: c.width, height: c.height, page: stats(0, 0, c.width, c.height), regions: {}};
  for (const r of regions) out.regions[r.id] = stats(r.x, r.y, r.w, r.h);
  return out;
})
"""


class _Browser:
    """One headless Chromium on a DevTools pipe."""

    def __init__(self, binary, profile):
        to_browser_r, to_browser_w = os.pipe()
        from_browser_r, from_browser_w = os.pipe()

        def fds():
            # The browser reads commands on fd 3 and writes answers on fd 4 (the only
            # descriptors it inherits: Python opens the others non-inheritable).
            a, b = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        args = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
                "--user-data-dir=" + profile, "--no-first-run", "--hide-scrollbars",
                "--window-size=%d,900" % WIDTH, "--mute-audio",
                # No network at all: no name resolves, every proxy is a dead port.
                "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9",
                "--proxy-bypass-list=<-loopback>", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "about:blank"]
        self.proc = subprocess.Popen(args, preexec_fn=fds, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     close_fds=False)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self.w = os.fdopen(to_browser_w, "wb", buffering=0)
        self.r = os.fdopen(from_browser_r, "rb", buffering=0)
        self.buf = b""
        self.next_id = 0
        self.events = []

    def _read(self, deadline):
        while b"\0" not in self.buf:
            if time.monotonic() > deadline:
                raise TimeoutError("no answer from Chromium")
            chunk = self.r.read(1 << 20)
            if not chunk:
                err = self.proc.stderr.read().decode(errors="replace")[-2000:]
                raise RuntimeError("Chromium closed its pipe: " + err)
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method, params=None, session=None, timeout=60):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self.w.write(json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            m = self._read(deadline)
            if m.get("id") == self.next_id:
                if "error" in m:
                    raise RuntimeError("%s: %s" % (method, m["error"]))
                return m.get("result", {})
            self.events.append(m)

    def wait_event(self, method, session, timeout=60):
        deadline = time.monotonic() + timeout
        while True:
            for i, e in enumerate(self.events):
                if e.get("method") == method and e.get("sessionId") == session:
                    return self.events.pop(i)
            self.events.append(self._read(deadline))

    def evaluate(self, expression, session, timeout=60):
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                           "awaitPromise": True}, session, timeout)
        if "exceptionDetails" in r:
            raise RuntimeError("evaluate: %s" % json.dumps(r["exceptionDetails"])[:2000])
        return r["result"].get("value")

    def close(self):
        try:
            self.call("Browser.close", timeout=10)
        except Exception:  # noqa: BLE001 - closing anyway
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for f in (self.w, self.r, self.proc.stderr):
            f.close()


def _tab(browser):
    target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
    return browser.call("Target.attachToTarget", {"targetId": target,
                                                  "flatten": True})["sessionId"]


def load(path, binary=None, timeout=60):
    """Loads the page at `path` from file:// and returns a Page."""
    binary = binary or find_chromium()
    url = "file://" + os.path.abspath(path)
    page = Page()
    with tempfile.TemporaryDirectory(prefix="fsdplab-chromium-") as profile:
        b = _Browser(binary, profile)
        try:
            s = _tab(b)
            for method in ("Runtime.enable", "Log.enable", "Network.enable", "Page.enable"):
                b.call(method, session=s)
            b.call("Network.emulateNetworkConditions", {"offline": True, "latency": 0,
                   "downloadThroughput": -1, "uploadThroughput": -1}, s)
            b.call("Emulation.setDeviceMetricsOverride", {"width": WIDTH, "height": 900,
                   "deviceScaleFactor": 1, "mobile": False}, s)
            b.call("Page.navigate", {"url": url}, s)
            b.wait_event("Page.loadEventFired", s, timeout)
            deadline = time.monotonic() + timeout
            while b.evaluate("document.body && document.body.getAttribute('data-rendered')",
                             s) is None:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            # Two frames, so that what was drawn is on screen.
            b.evaluate("new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))",
                       s)
            page.facts = b.evaluate(FACTS, s)
            height = min(int(page.facts["height"]), 16000)
            shot = b.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True,
                          "clip": {"x": 0, "y": 0, "width": WIDTH, "height": height,
                                   "scale": 1}}, s, timeout)
            page.png = base64.b64decode(shot["data"])
            for e in b.events:
                m, p = e.get("method"), e.get("params", {})
                if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                    page.errors.append("console: " + " ".join(
                        str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
                elif m == "Runtime.exceptionThrown":
                    d = p.get("exceptionDetails", {})
                    page.errors.append("exception: " + d.get("exception", {}).get(
                        "description", d.get("text", "")))
                elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                    page.errors.append("log: " + p["entry"].get("text", ""))
                elif m == "Network.requestWillBeSent":
                    req = p.get("request", {}).get("url", "")
                    if req != url and not req.startswith("data:"):
                        page.requests.append(req)
            page.interaction = b.evaluate(INTERACT, s)
            # The screenshot's statistics, from a blank tab.
            s2 = _tab(b)
            regions = [c for c in page.facts["canvases"] if c["y"] + c["h"] <= height]
            page.shot = b.evaluate("(%s)(%s, %s)" % (SHOT_STATS, json.dumps(shot["data"]),
                                                     json.dumps(regions)), s2, timeout)
        finally:
            b.close()
    return page
