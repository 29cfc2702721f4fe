"""The trace as the recorder writes it: the document's units, each recorded step's events as
JSON objects (times from the step's marks), the JSON text (one event a line), and the file
written whole or not at all."""

import contextlib
import json
import os
import tempfile

TRACE_FORMAT = "fsdplab.trace"
TRACE_VERSION = 1


def write_atomic(out, text):
    """Writes `text` to `out` through a temporary file in the same directory: whole or not at
    all. Returns `out`."""
    directory = os.path.dirname(os.path.abspath(out))
    fd, tmp = tempfile.mkstemp(prefix=".fsdplab-trace-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return out


def world_and_rank():
    """(world size, rank) of torch's default process group; (1, 0) outside one."""
    import torch

    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def rank_path(path, rank, world_size):
    """Where rank `rank` writes a trace asked for at `path`: `path` with '{rank}' filled in if it
    has one; else, in a process group of more than one rank, 'trace.json' -> 'trace.rank3.json';
    else `path` itself."""
    path = os.fspath(path)
    if "{rank}" in path:
        return path.replace("{rank}", str(rank))
    if world_size <= 1:
        return path
    root, ext = os.path.splitext(path)
    return f"{root}.rank{rank}{ext or '.json'}"


def unit_entries(units):
    """The trace's units: name, parent, recompute ("reentrant", "inside" or "none") and params."""
    entries = []
    for u in units:
        if "reentrant" in u.recompute_seen:
            recompute = "reentrant"
        elif "inside" in u.recompute_seen:
            recompute = "inside"
        else:
            recompute = "none"
        entries.append(
            {
                "name": u.name,
                "parent": u.parent.name if u.parent is not None else None,
                "recompute": recompute,
                "params": u.params,
            }
        )
    return entries


def step_dict(raw_step):
    """One recorded step (its microbatches' raw events, the times of its marks and the
    optimizer's spans) as the trace's step object."""
    microbatches, times, optimizer_spans = raw_step
    step = {"microbatches": []}
    for raw in microbatches:
        events = []
        for op, obj, m in raw:
            if op == "collective":
                kind, u, nbytes, a, b, copy_out = obj
                ev = {
                    "op": "collective",
                    "kind": kind,
                    "unit": u.name,
                    "bytes": nbytes,
                    "start_us": round(times[a], 3),
                    "end_us": round(max(times[b], times[a]), 3),
                }
                if copy_out is not None:
                    c0, c1 = copy_out
                    ev["copy_out_us"] = round(max(times[c1] - times[c0], 0.0), 3)
                events.append(ev)
                continue
            if op == "compute":
                frame = obj
                us = sum(times[b] - times[a] for a, b in frame.segments)
                ev = {
                    "op": "compute",
                    "unit": frame.unit.name if frame.unit is not None else None,
                    "phase": frame.phase,
                    "us": round(max(us, 0.0), 3),
                }
                if frame.memory is not None:
                    saved, released, peak, grads, grads_at_peak = frame.memory
                    if saved:
                        ev["saved_bytes"] = saved
                    ev["released_bytes"] = released
                    if peak:
                        ev["peak_bytes"] = peak
                    if grads is not None and frame.phase == "backward":
                        ev["grad_bytes"] = grads
                        ev["peak_grad_bytes"] = grads_at_peak
                elif frame.saved:
                    ev["saved_bytes"] = frame.saved
                if frame.name == "fsdp" and ev["us"] <= 0:
                    continue  # the bracket was all collective
            elif op == "backward_end":
                ev = {"op": op}
            else:
                ev = {"op": op, "unit": obj.name}
            ev["ts_us"] = round(times[m], 3)
            events.append(ev)
        step["microbatches"].append({"events": events})
    if optimizer_spans and step["microbatches"]:
        # The optimizer step after the last microbatch's backward_end: step() and zero_grad()
        # wherever the step ran them (a zero_grad() before the first forward included). Its
        # start is the first of them after that backward_end, so the events' times stay in
        # order (a zero_grad() at the start of the step ran before the first forward).
        us = sum(max(times[b] - times[a], 0.0) for a, b in optimizer_spans)
        last = step["microbatches"][-1]["events"]
        end = max((e["ts_us"] for e in last if "ts_us" in e), default=0.0)
        starts = [times[a] for a, _ in optimizer_spans]
        first = min((t for t in starts if t >= end), default=min(starts))
        last.append(
            {
                "op": "compute",
                "unit": None,
                "phase": "optimizer",
                "us": round(us, 3),
                "name": "optimizer",
                "ts_us": round(first, 3),
            }
        )
    return step


def dumps(trace):
    """The trace as JSON text: the document indented, each event on one line."""
    steps = trace["steps"]
    head = dict(trace)
    head["steps"] = []
    text = json.dumps(head, indent=1)
    if not steps:
        return text + "\n"
    parts = []
    for step in steps:
        mbs = []
        for mb in step["microbatches"]:
            events = ",\n".join("      " + json.dumps(e) for e in mb["events"])
            mbs.append('    {"events": [\n' + events + "\n    ]}")
        parts.append('  {"microbatches": [\n' + ",\n".join(mbs) + "\n  ]}")
    body = ",\n".join(parts)
    assert text.endswith('"steps": []\n}')
    return text[: -len("[]\n}")] + "[\n" + body + "\n ]\n}\n"
