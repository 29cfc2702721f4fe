"""The recorder's clocks: a mark is an index into the step's marks, read as microseconds from the
first mark once the step has ended (CUDA events on the current stream, read after one
synchronize; else the monotonic clock)."""

import time

import torch


class CpuClock:
    name = "cpu"

    def __init__(self):
        self.marks = []

    def mark(self):
        self.marks.append(time.perf_counter_ns())
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
