"""The recorder's clocks: a mark is an index into the step's marks, read as microseconds from the
first mark once the step has ended (CUDA events on the current stream, read after one
synchronize; else the monotonic clock, less the recorder's own time in its hooks: the step as it
runs without them)."""

import time

import torch


class CpuClock:
    """The monotonic clock stopped while the recorder's hooks run (hook_start to their end,
    added to hidden_ns): a mark inside a hook is where the hook began, and the recorder's own
    Python does not lengthen the computes around it."""

    name = "cpu"

    def __init__(self):
        self.marks = []
        self.hidden_ns = 0  # the recorder's own time so far, left out of the marks
        self.hook_start = None  # when the recorder's hook running now began

    def mark(self):
        now = self.hook_start if self.hook_start is not None else time.perf_counter_ns()
        self.marks.append(now - self.hidden_ns)
        return len(self.marks) - 1

    def times_us(self):
        if not self.marks:
            return []
        t0 = self.marks[0]
        return [(t - t0) / 1000.0 for t in self.marks]


class CudaClock:
    """Marks are CUDA events on the current stream; read once, after the step has ended."""

    name = "cuda"

    def __init__(self):
        self.marks = []
        # The host's time in the recorder's hooks is not the device's: nothing is left out.
        self.hidden_ns = 0
        self.hook_start = None

    def mark(self):
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        self.marks.append(ev)
        return len(self.marks) - 1

    def times_us(self):
        if not self.marks:
            return []
        torch.cuda.synchronize()
        first = self.marks[0]
        return [first.elapsed_time(ev) * 1000.0 for ev in self.marks]
