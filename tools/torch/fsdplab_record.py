"""Record what a PyTorch training step did as an fsdplab trace (``fsdplab.trace`` v1).

    import fsdplab_record
    rec = fsdplab_record.Recorder(model)      # units: detected, or units=[names] / a predicate
    with rec.step():
        for batch in microbatches:
            loss_fn(model(batch)).backward()
    rec.save("trace.json")                        # trace.rank3.json on rank 3 of a process group

The trace then drives ``fsdplab validate``, ``order``, ``schedule`` and ``simulate``.

What is recorded (DESIGN section 4.1):
  * units in registration order (module definition order), each with its parameters (name
    relative to the unit, dtype fp32/bf16/fp16/mxfp8, shape);
  * per microbatch: pre_forward / post_forward, pre_backward / post_backward, backward_end, and one
    ``compute`` per unit and phase with the unit's own time (nested units excluded) and the bytes
    autograd saved for backward (``saved_bytes``) where saved-tensor hooks can see them;
  * recomputation: a unit's forward hooks firing during backward is a reentrant recomputation
    (pre_forward, compute phase "recompute", post_forward); a forward of a module that holds a
    unit's parameters, during backward and outside that unit's hooks, is an inside recomputation
    (a ``compute`` of the unit with phase "recompute").

Units: PyTorch FSDP2 (``fully_shard``) modules and Megatron-FSDP unit modules are found by class
name and attributes (no import of the FSDP packages); otherwise module names, a predicate, or by
default the root plus each child of the model's first ``ModuleList``. The root is always a unit.

Hooks are chosen by feature detection so this runs on PyTorch 1.13 and on current 2.x: full
backward pre-hooks where they exist, else hooks on the gradient of the unit's outputs;
post-accumulate-grad hooks where they exist, else parameter gradient hooks, counted down; a unit
without trainable parameters uses its module backward hook; the end of the backward is a callback
queued on the autograd engine. Durations come from CUDA events resolved after the step (nothing
synchronises inside it) when the model is on a GPU, else from the monotonic clock.

The recorder never changes results: hooks return nothing and the saved-tensor hooks store the
tensor itself. Outside ``rec.step()`` the hooks return at once. Its own cost is in
``rec.overhead()`` and in the trace's meta.recorder.
"""

import contextlib
import json
import os
import tempfile
import time
import warnings
import weakref

import torch

__all__ = ["Recorder", "trace_dtype", "rank_path", "detect_units", "__version__"]
__version__ = "1.0"

_TRACE_FORMAT = "fsdplab.trace"
_TRACE_VERSION = 1

_DTYPES = {
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
}
_DTYPE_NAMES = ("fp32", "bf16", "fp16", "mxfp8")


def _type_names(obj):
    return {cls.__name__ for cls in type(obj).__mro__}


def trace_dtype(tensor):
    """The trace dtype of a parameter: fp32, bf16, fp16, or mxfp8 for Transformer Engine MXFP8
    tensors (recognised by class name, also as the local tensor of a DTensor). None if the dtype
    has no trace spelling."""
    for t in (tensor, getattr(tensor, "_local_tensor", None)):
        if t is not None and any("MXFP8" in name for name in _type_names(t)):
            return "mxfp8"
    return _DTYPES.get(tensor.dtype)


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


def _is_fsdp2_module(module):
    return "FSDPModule" in _type_names(module)


def _megatron_fsdp_wrappers(model):
    return [
        m
        for m in model.modules()
        if "MegatronFSDP" in _type_names(m) and hasattr(m, "fsdp_unit_modules")
    ]


def detect_units(model, units=None):
    """The qualified names (relative to `model`, '' for the root) of the modules that are units,
    in registration order, and how they were found ('names', 'predicate', 'fsdp2',
    'megatron-fsdp' or 'module-list')."""
    named = list(model.named_modules())
    if units is not None:
        if callable(units):
            picked = {name for name, m in named if name and units(name, m)}
            how = "predicate"
        else:
            wanted = [units] if isinstance(units, str) else list(units)
            known = {name for name, _ in named}
            unknown = [n for n in wanted if n not in known]
            if unknown:
                raise ValueError(
                    f"fsdplab_record: units={unknown!r}: no such module in the model "
                    f"(module names look like {next((n for n in known if n), '(none)')!r})"
                )
            picked = set(wanted)
            how = "names"
    elif any(_is_fsdp2_module(m) for _, m in named):
        picked = {name for name, m in named if _is_fsdp2_module(m)}
        how = "fsdp2"
    elif _megatron_fsdp_wrappers(model):
        picked = set()
        for wrapper in _megatron_fsdp_wrappers(model):
            declared = getattr(wrapper, "fsdp_unit_modules", None) or []
            classes = tuple(c for c in declared if isinstance(c, type))
            picked.update(name for name, m in named if classes and isinstance(m, classes))
        how = "megatron-fsdp"
    else:
        picked = set()
        for name, m in named:
            if isinstance(m, torch.nn.ModuleList):
                prefix = f"{name}." if name else ""
                picked = {prefix + child for child, _ in m.named_children()}
                break
        how = "module-list"
    picked.add("")
    return [name for name, _ in named if name in picked], how


def _tensors_in(obj, out):
    """Appends the tensors inside a (nested) tuple / list / dict output to `out`."""
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            _tensors_in(x, out)
    elif isinstance(obj, dict):
        for x in obj.values():
            _tensors_in(x, out)
    return out


class _Unit:
    __slots__ = (
        "index",
        "name",
        "qualname",
        "module",
        "parent",
        "params",
        "param_slots",
        "trainable",
        "recompute_seen",
        "fw_depth",
        "bw_frame",
        "grads_seen",
        "remaining",
    )

    def __init__(self, index, name, qualname, module):
        self.index = index
        self.name = name
        self.qualname = qualname
        self.module = module
        self.parent = None
        self.params = []  # trace entries {"name", "dtype", "shape"}
        self.param_slots = []  # (module, attribute): where the parameter lives now
        self.trainable = False  # has parameters that require grad (at construction)
        self.recompute_seen = set()  # "reentrant", "inside"
        self.fw_depth = 0  # open forward / recompute frames of this unit
        self.bw_frame = None  # the open backward frame
        self.grads_seen = set()  # parameter slots whose gradient arrived in this backward pass
        self.remaining = 0  # gradients still to come before post_backward


class _Frame:
    """An open span of one unit's compute: the time and saved bytes attributed to it."""

    __slots__ = ("unit", "phase", "segments", "saved", "saved_keys", "leaf")

    def __init__(self, unit, phase, leaf=None):
        self.unit = unit  # _Unit, or None for work outside every unit (the loss)
        self.phase = phase
        self.segments = []  # (mark, mark) pairs
        self.saved = 0
        self.saved_keys = set()
        self.leaf = leaf  # the leaf module of an inside recomputation


class _CpuClock:
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


class _CudaClock:
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


def _has_full_backward_pre_hook():
    return hasattr(torch.nn.Module, "register_full_backward_pre_hook")


def _has_post_accumulate_grad_hook():
    return hasattr(torch.Tensor, "register_post_accumulate_grad_hook")


class Recorder:
    """Records the steps run inside ``with rec.step():`` and writes them with ``save``.

    Args:
      model: the module to record (its root is always a unit).
      units: None to detect (FSDP2, Megatron-FSDP, else the root plus each child of the first
        ModuleList), a list of module names relative to `model` (e.g. ["layers.0", "layers.1"]),
        or a predicate ``f(name, module) -> bool``.
      root_name: the trace name of the root unit; other units are ``root_name + "." + name``.
      timing: "auto" (CUDA events when the model has CUDA parameters), "cuda" or "cpu".
      hooks: "auto" (module backward pre-hooks / post-accumulate-grad hooks where this PyTorch has
        them) or "tensor" (hooks on output and parameter gradients, as on PyTorch 1.13).
      saved_bytes: measure the activations autograd saves (saved-tensor hooks).
      param_dtype: trace dtype for every parameter ("bf16", ...), e.g. the gather dtype of a
        mixed-precision policy; None reads each parameter's dtype.
    """

    def __init__(
        self,
        model,
        units=None,
        *,
        root_name="model",
        timing="auto",
        hooks="auto",
        saved_bytes=True,
        param_dtype=None,
    ):
        if hooks not in ("auto", "tensor"):
            raise ValueError(f"fsdplab_record: hooks={hooks!r}: expected 'auto' or 'tensor'")
        if timing not in ("auto", "cuda", "cpu"):
            raise ValueError(f"fsdplab_record: timing={timing!r}: expected 'auto', 'cuda' or 'cpu'")
        if param_dtype is not None and param_dtype not in _DTYPE_NAMES:
            raise ValueError(
                f"fsdplab_record: param_dtype={param_dtype!r}: expected one of {_DTYPE_NAMES}"
            )
        self._model = model
        self._param_dtype = param_dtype
        self._saved_bytes = saved_bytes and hasattr(torch.autograd.graph, "saved_tensors_hooks")
        if timing == "auto":
            on_cuda = any(p.is_cuda for p in model.parameters())
            timing = "cuda" if on_cuda and torch.cuda.is_available() else "cpu"
        self._timing = timing
        self._module_pre_backward = hooks == "auto" and _has_full_backward_pre_hook()
        self._post_accumulate = hooks == "auto" and _has_post_accumulate_grad_hook()

        qualnames, self.detected_by = detect_units(model, units)
        self._units = self._build_units(qualnames, root_name)
        self._handles = []
        self._hooked_params = {}  # id(tensor) -> (weakref, handle)
        self._steps = []
        self._active = False
        self._hook_calls = 0
        self._hook_ns = 0
        # FSDP2 swaps unsharded parameters in during forward: hook those as they appear.
        self._lazy_params = self.detected_by == "fsdp2"
        self._register_hooks()

    # ----------------------------------------------------------------------------------------
    # Public API

    @property
    def units(self):
        """The unit names, in registration order."""
        return [u.name for u in self._units]

    @contextlib.contextmanager
    def step(self):
        """Records one training step: every forward / backward (microbatch) run inside."""
        if self._active:
            raise RuntimeError("fsdplab_record: rec.step() is already open")
        self._begin_step()
        try:
            if self._saved_bytes:
                with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                    yield self
            else:
                yield self
        except BaseException:
            self._active = False
            self._clear_step()
            raise
        self._active = False
        try:
            step = self._end_step()
        finally:
            self._clear_step()
        if step[0]:
            self._steps.append(step)
        else:
            warnings.warn("fsdplab_record: no module of the model ran inside rec.step()")

    def overhead(self):
        """The recorder's own time inside its hooks: calls, total and mean microseconds."""
        calls = self._hook_calls
        total_us = self._hook_ns / 1000.0
        return {
            "hook_calls": calls,
            "hook_total_us": round(total_us, 3),
            "us_per_hook": round(total_us / calls, 3) if calls else 0.0,
        }

    def trace(self):
        """The trace as a JSON-ready dict (meta, units, steps recorded so far)."""
        world_size, rank = 1, 0
        dist = getattr(torch, "distributed", None)
        if dist is not None and dist.is_available() and dist.is_initialized():
            world_size, rank = dist.get_world_size(), dist.get_rank()
        units = []
        for u in self._units:
            if "reentrant" in u.recompute_seen:
                recompute = "reentrant"
            elif "inside" in u.recompute_seen:
                recompute = "inside"
            else:
                recompute = "none"
            units.append(
                {
                    "name": u.name,
                    "parent": u.parent.name if u.parent is not None else None,
                    "recompute": recompute,
                    "params": u.params,
                }
            )
        meta = {
            "source": "torch",
            "world_size": world_size,
            "rank": rank,
            "recorder": {
                "torch": str(torch.__version__),
                "units_from": self.detected_by,
                "timing": self._timing,
                "pre_backward": "module-hook" if self._module_pre_backward else "tensor-hook",
                "post_backward": (
                    "post-accumulate-grad-hook" if self._post_accumulate else "grad-hook"
                ),
                **self.overhead(),
            },
        }
        return {
            "format": _TRACE_FORMAT,
            "version": _TRACE_VERSION,
            "meta": meta,
            "units": units,
            "steps": [self._step_dict(s) for s in self._steps],
        }

    def save(self, path):
        """Writes the trace whole or not at all; returns the path written (see rank_path)."""
        trace = self.trace()
        out = rank_path(path, trace["meta"]["rank"], trace["meta"]["world_size"])
        text = _dumps(trace)
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

    def remove(self):
        """Removes every hook the recorder installed."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._remove_leaf_hooks()
        for _, handle in self._hooked_params.values():
            handle.remove()
        self._hooked_params.clear()

    # ----------------------------------------------------------------------------------------
    # Model structure

    def _build_units(self, qualnames, root_name):
        by_qualname = {}
        units = []
        for i, q in enumerate(qualnames):
            module = self._model.get_submodule(q) if q else self._model
            u = _Unit(i, f"{root_name}.{q}" if q else root_name, q, module)
            units.append(u)
            by_qualname[q] = u
        self._leaf_owner = {}  # id(module) -> _Unit, for modules that hold a unit's parameters
        self._unit_of_module = {id(u.module): u for u in units}
        owner_of = {}  # qualname -> owning unit
        seen_params = set()
        for q, module in self._model.named_modules():
            # The owner is the nearest unit at or above the module.
            if q in by_qualname:
                owner = by_qualname[q]
                if q:
                    parent_q = q.rpartition(".")[0]
                    owner.parent = owner_of[parent_q]
            else:
                owner = owner_of[q.rpartition(".")[0]]
            owner_of[q] = owner
            direct = [(n, p) for n, p in module._parameters.items() if p is not None]
            if direct and id(module) not in self._unit_of_module:
                self._leaf_owner[id(module)] = owner
            for attr, p in direct:
                if id(p) in seen_params:
                    continue  # a shared parameter belongs to its first owner
                seen_params.add(id(p))
                rel = q[len(owner.qualname) :].lstrip(".") if owner.qualname else q
                dtype = self._param_dtype or trace_dtype(p)
                if dtype is None:
                    raise ValueError(
                        f"fsdplab_record: parameter '{owner.name}:{rel + '.' if rel else ''}"
                        f"{attr}' has dtype {p.dtype}, which a trace cannot hold (fp32, bf16, "
                        f"fp16, mxfp8); pass param_dtype='bf16' (or the gather dtype)"
                    )
                owner.params.append(
                    {
                        "name": f"{rel}.{attr}" if rel else attr,
                        "dtype": dtype,
                        "shape": [int(s) for s in p.shape],
                    }
                )
                owner.param_slots.append((module, attr))
                owner.trainable = owner.trainable or p.requires_grad
        return units

    def _register_hooks(self):
        for u in self._units:
            m = u.module
            self._handles.append(m.register_forward_pre_hook(self._make_pre_forward(u)))
            self._handles.append(m.register_forward_hook(self._make_post_forward(u)))
            if self._module_pre_backward:
                self._handles.append(
                    m.register_full_backward_pre_hook(self._make_module_pre_backward(u))
                )
            if not u.trainable:
                self._handles.append(m.register_full_backward_hook(self._make_module_backward(u)))
            else:
                self._hook_params(u)
        # Forwards of the modules that hold a unit's parameters matter only during backward
        # (inside recomputation): global module hooks, installed for the backward only, cost the
        # forward nothing.
        self._leaf_handles = []

    def _install_leaf_hooks(self):
        if self._leaf_owner and not self._leaf_handles:
            from torch.nn.modules import module as module_lib

            self._leaf_handles = [
                module_lib.register_module_forward_pre_hook(self._leaf_pre),
                module_lib.register_module_forward_hook(self._leaf_post),
            ]

    def _remove_leaf_hooks(self):
        for h in self._leaf_handles:
            h.remove()
        self._leaf_handles = []

    # ----------------------------------------------------------------------------------------
    # Step state

    def _begin_step(self):
        self._clock = _CudaClock() if self._timing == "cuda" else _CpuClock()
        self._microbatches = []  # lists of raw events
        self._events = None  # raw events of the open microbatch
        self._stack = []  # open frames, innermost last
        self._gap = None  # frame for work outside every unit before the backward
        self._in_backward = False
        self._last_mark = None
        self._param_ptrs = {p.data_ptr() for p in self._model.parameters()}
        for u in self._units:
            u.fw_depth = 0
            u.bw_frame = None
            u.grads_seen = set()
        self._active = True

    def _clear_step(self):
        self._remove_leaf_hooks()
        self._clock = None
        self._microbatches = None
        self._events = None
        self._stack = None
        self._gap = None
        self._in_backward = False

    def _mark(self):
        """Closes the running time segment: it belongs to the innermost open frame (or, before
        the backward, to the work outside every unit)."""
        m = self._clock.mark()
        if self._events is None:
            self._events = []
            self._microbatches.append(self._events)
        elif self._last_mark is not None:
            if self._stack:
                self._stack[-1].segments.append((self._last_mark, m))
            elif not self._in_backward:
                if self._gap is None:
                    self._gap = _Frame(None, "forward")
                self._gap.segments.append((self._last_mark, m))
        self._last_mark = m
        return m

    def _emit(self, op, unit, m):
        if self._gap is not None:
            # Work outside every unit before the backward (the loss): a compute without a unit.
            self._events.append(("compute", self._gap, self._gap.segments[0][0]))
            self._gap = None
        self._events.append((op, unit, m))

    def _emit_compute(self, frame):
        first = frame.segments[0][0] if frame.segments else self._last_mark
        self._events.append(("compute", frame, first))

    def _end_step(self):
        if self._events is not None and self._stack:
            open_units = ", ".join(f.unit.name for f in self._stack if f.unit is not None)
            raise RuntimeError(
                f"fsdplab_record: the step ended with units still open ({open_units}): a forward "
                "or backward was interrupted"
            )
        for raw in self._microbatches:
            for op, obj, _ in raw:
                if op == "compute":
                    obj.saved_keys = None
        # Read the clock now (CUDA: one synchronize, after the step); build the events on demand.
        return (self._microbatches, self._clock.times_us())

    @staticmethod
    def _step_dict(raw_step):
        microbatches, times = raw_step
        step = {"microbatches": []}
        for raw in microbatches:
            events = []
            for op, obj, m in raw:
                if op == "compute":
                    frame = obj
                    us = sum(times[b] - times[a] for a, b in frame.segments)
                    ev = {
                        "op": "compute",
                        "unit": frame.unit.name if frame.unit is not None else None,
                        "phase": frame.phase,
                        "us": round(max(us, 0.0), 3),
                    }
                    if frame.saved:
                        ev["saved_bytes"] = frame.saved
                elif op == "backward_end":
                    ev = {"op": op}
                else:
                    ev = {"op": op, "unit": obj.name}
                ev["ts_us"] = round(times[m], 3)
                events.append(ev)
            step["microbatches"].append({"events": events})
        return step

    # ----------------------------------------------------------------------------------------
    # Hooks. Each returns None (results are never changed) and returns at once outside a step.

    def _make_pre_forward(self, u):
        def hook(module, inputs):
            if not self._active:
                return
            t0 = time.perf_counter_ns()
            m = self._mark()
            phase = "recompute" if self._in_backward else "forward"
            if phase == "recompute":
                u.recompute_seen.add("reentrant")
            self._stack.append(_Frame(u, phase))
            u.fw_depth += 1
            self._emit("pre_forward", u, m)
            self._hook_calls += 1
            self._hook_ns += time.perf_counter_ns() - t0

        return hook

    def _make_post_forward(self, u):
        def hook(module, inputs, output):
            if not self._active:
                return
            t0 = time.perf_counter_ns()
            m = self._mark()
            frame = self._pop_forward_frame(u)
            self._emit_compute(frame)
            self._emit("post_forward", u, m)
            if torch.is_grad_enabled():
                if not self._module_pre_backward:
                    self._hook_output_grads(u, output)
                if u.trainable and self._lazy_params:
                    self._hook_params(u)
            self._hook_calls += 1
            self._hook_ns += time.perf_counter_ns() - t0

        return hook

    def _pop_forward_frame(self, u):
        for i in range(len(self._stack) - 1, -1, -1):
            f = self._stack[i]
            if f.unit is u and f.phase != "backward" and f.leaf is None:
                del self._stack[i]
                u.fw_depth -= 1
                return f
        raise RuntimeError(f"fsdplab_record: post_forward of '{u.name}' without its pre_forward")

    def _hook_output_grads(self, u, output):
        """pre_backward(u) at the first gradient of any of this call's outputs. A tensor that is
        also a nested unit's output (a parent returning its child's output) carries one hook
        listing the units outermost first, so the parent's pre_backward comes first."""
        tensors = [t for t in _tensors_in(output, []) if t.requires_grad]
        if not tensors:
            return
        call = [u, False]  # the unit, and whether this call's pre_backward has fired
        for t in tensors:
            calls = getattr(t, "_fsdplab_pre_backward", None)
            if calls is not None:
                calls.insert(0, call)
                continue
            calls = [call]
            t._fsdplab_pre_backward = calls
            t.register_hook(self._make_output_grad_hook(calls))

    def _make_output_grad_hook(self, calls):
        def on_grad(grad):
            if not self._active:
                return
            for call in calls:
                if not call[1]:
                    call[1] = True
                    self._pre_backward(call[0])

        return on_grad

    def _hook_params(self, u):
        """Hooks the tensors the unit's parameters are now (FSDP2 swaps in unsharded ones during
        forward); each tensor once."""
        for module, attr in u.param_slots:
            p = module._parameters.get(attr)
            if p is None or not p.requires_grad:
                continue
            entry = self._hooked_params.get(id(p))
            if entry is not None and entry[0]() is p:
                continue
            key = (id(module), attr)
            if self._post_accumulate:
                handle = p.register_post_accumulate_grad_hook(
                    lambda param, u=u, key=key: self._param_grad(u, key)
                )
            else:
                handle = p.register_hook(lambda grad, u=u, key=key: self._param_grad(u, key))
            self._hooked_params[id(p)] = (weakref.ref(p), handle)

    def _trainable_slots(self, u):
        return sum(
            1
            for module, attr in u.param_slots
            if module._parameters.get(attr) is not None and module._parameters[attr].requires_grad
        )

    def _make_module_pre_backward(self, u):
        def hook(module, grad_output):
            if self._active:
                self._pre_backward(u)

        return hook

    def _make_module_backward(self, u):
        def hook(module, grad_input, grad_output):
            if not self._active or u.bw_frame is None:
                return
            t0 = time.perf_counter_ns()
            self._post_backward(u, self._mark())
            self._hook_calls += 1
            self._hook_ns += time.perf_counter_ns() - t0

        return hook

    def _pre_backward(self, u):
        t0 = time.perf_counter_ns()
        m = self._mark()
        if not self._in_backward:
            self._in_backward = True
            for v in self._units:
                v.grads_seen = set()
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_end)
            self._install_leaf_hooks()
        if u.bw_frame is not None:
            # Called again while still in backward (a shared unit): recorded as it ran.
            self._stack.remove(u.bw_frame)
            self._stack.append(u.bw_frame)
        else:
            u.bw_frame = _Frame(u, "backward")
            u.remaining = (
                max(self._trainable_slots(u) - len(u.grads_seen), 0) if u.trainable else 0
            )
            self._stack.append(u.bw_frame)
        self._emit("pre_backward", u, m)
        self._hook_calls += 1
        self._hook_ns += time.perf_counter_ns() - t0

    def _param_grad(self, u, key):
        if not self._active or not self._in_backward or key in u.grads_seen:
            return
        t0 = time.perf_counter_ns()
        u.grads_seen.add(key)
        if u.bw_frame is not None and u.remaining > 0:
            u.remaining -= 1
            if u.remaining == 0:
                self._post_backward(u, self._mark())
        self._hook_calls += 1
        self._hook_ns += time.perf_counter_ns() - t0

    def _post_backward(self, u, m):
        frame = u.bw_frame
        u.bw_frame = None
        self._stack.remove(frame)
        self._emit_compute(frame)
        self._emit("post_backward", u, m)

    def _backward_end(self):
        if not self._active or not self._in_backward:
            return
        t0 = time.perf_counter_ns()
        m = self._mark()
        # Units whose gradients did not all arrive (unused parameters) end with the backward.
        for frame in reversed([f for f in self._stack if f.phase == "backward"]):
            self._post_backward(frame.unit, m)
        self._emit("backward_end", None, m)
        self._remove_leaf_hooks()
        self._in_backward = False
        self._events = None
        self._last_mark = None
        self._gap = None
        self._hook_calls += 1
        self._hook_ns += time.perf_counter_ns() - t0

    def _leaf_pre(self, module, inputs):
        owner = self._leaf_owner.get(id(module))
        if owner is None or not self._active or not self._in_backward or owner.fw_depth > 0:
            return
        top = self._stack[-1] if self._stack else None
        if top is not None and top.leaf is not None and top.unit is owner:
            return  # already inside this unit's recomputation (a nested leaf)
        t0 = time.perf_counter_ns()
        self._mark()
        owner.recompute_seen.add("inside")
        self._stack.append(_Frame(owner, "recompute", leaf=module))
        self._hook_calls += 1
        self._hook_ns += time.perf_counter_ns() - t0

    def _leaf_post(self, module, inputs, output):
        if not self._active or not self._stack or self._stack[-1].leaf is not module:
            return
        t0 = time.perf_counter_ns()
        self._mark()
        self._emit_compute(self._stack.pop())
        self._hook_calls += 1
        self._hook_ns += time.perf_counter_ns() - t0

    # Saved-tensor hooks: count the activations each open forward / recompute keeps for
    # backward. Parameters (and views of them) are not activations.
    def _pack(self, t):
        if not self._active or not self._stack:
            return t
        frame = self._stack[-1]
        if frame.phase == "backward":
            return t
        t0 = time.perf_counter_ns()
        try:
            ptr = t.data_ptr()
        except (RuntimeError, NotImplementedError, TypeError):  # no storage to measure
            ptr = None
        if ptr is not None and ptr not in self._param_ptrs:
            base = t._base if t._base is not None else t
            key = (ptr, t.numel(), t.dtype)
            if not isinstance(base, torch.nn.Parameter) and key not in frame.saved_keys:
                frame.saved_keys.add(key)
                frame.saved += t.numel() * t.element_size()
        self._hook_calls += 1
        self._hook_ns += time.perf_counter_ns() - t0
        return t

    @staticmethod
    def _unpack(t):
        return t


def _dumps(trace):
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
