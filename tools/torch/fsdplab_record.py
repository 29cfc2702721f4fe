"""Record what a PyTorch training step did as an fsdplab trace (``fsdplab.trace`` v1).

    import fsdplab_record
    rec = fsdplab_record.Recorder(model, optimizer=opt)  # units: detected, or units=[names]
    with rec.step():
        for batch in microbatches:
            loss_fn(model(batch)).backward()
        opt.step()
        opt.zero_grad()
    rec.save("trace.json")                        # trace.rank3.json on rank 3 of a process group

The trace then drives ``fsdplab validate``, ``order``, ``schedule`` and ``simulate``.

What is recorded (DESIGN section 4.1):
  * where it ran: meta.device ("cpu" or "cuda") and, in a process group, meta.backend (the
    process group's backend for that device: "gloo", "nccl", ...);
  * units in registration order (module definition order), each with its parameters (name
    relative to the unit, dtype fp32/bf16/fp16/mxfp8, shape);
  * per microbatch: pre_forward / post_forward, pre_backward / post_backward, backward_end, and a
    ``compute`` for each run of a unit's own work (nested units excluded: a parent's forward is
    a compute before its first child and one after each child; its backward likewise, so a
    model's loss and head backward come before its layers' and its embedding's after them) with
    its time and the bytes autograd saved for backward (``saved_bytes``) where saved-tensor hooks
    can see them;
  * the optimizer step, when the Recorder is given the optimizer: its step() and zero_grad()
    inside rec.step() as one ``compute`` without a unit, phase "optimizer", after the last
    microbatch's backward_end (a zero_grad() at the start of the step counts there too);
  * memory: in the first ``memory_steps`` steps (default 1) a dispatch mode counts every
    storage an operator creates until it is freed, and each compute gets what it did to the
    memory beyond the parameters, gradients and FSDP's buffers: ``saved_bytes`` it keeps,
    ``released_bytes`` of earlier computes' it frees, ``peak_bytes``, how far its own
    allocations rose above its start (its temporaries: activation gradients, the loss's
    logits gradient, what a recomputation keeps), and for a backward ``grad_bytes``, the unit's
    gradients it produced. The count slows those steps' computes several times over, so their
    times are not the run's (the simulator's step time leaves the first step out); a later step
    that ran alike (the same hooks and computes) carries the same memory;
  * recomputation: a unit's forward hooks firing during backward is a reentrant recomputation
    (pre_forward, compute phase "recompute", post_forward), whatever torch.utils.checkpoint mode
    ran it (reentrant, non-reentrant, selective); a forward of modules that hold a unit's
    parameters, during backward and outside that unit's hooks, is an inside recomputation (one
    ``compute`` of the unit with phase "recompute", however many of its modules ran again).
    Non-reentrant checkpoints of torch >= 2.1 stop a recomputation early by raising inside the
    recomputed forward; the recorder's forward hooks are registered with ``always_call`` so they
    still close it (older torch: it is closed at the next backward event);
  * FSDP2: the time FSDP spends in its own hooks (unshard and the wait for the all-gather, copy
    out, reshard, reduce-scatter, its root callbacks) is not compute: each FSDP parameter group's
    methods are bracketed while recording and that time is excluded from every unit. The
    all-gathers and reduce-scatters are written as measured ``collective`` events (kind, unit,
    bytes, start_us, end_us; all-gather: from its issue to the end of the wait for it), and the
    rest of FSDP's work (copies, casts) as computes without a unit (``fsdp_work``).

Units: PyTorch FSDP2 (``fully_shard``) modules and Megatron-FSDP unit modules are found by class
name and attributes (no import of the FSDP packages); otherwise module names, a predicate, or by
default the root plus each child of the model's first ``ModuleList``. The root is always a unit.

Hooks are chosen by feature detection so this runs on PyTorch 1.13 and on current 2.x: a unit's
backward starts at the first gradient of one of its outputs (a hook on each output tensor, which
costs far less than a module backward pre-hook: that one wraps the inputs and outputs of every
call in a Python autograd function); post-accumulate-grad hooks where they exist, else parameter
gradient hooks, counted down; a unit without trainable parameters uses its module backward hook;
the end of the backward is a callback queued on the autograd engine. Durations come from CUDA
events resolved after the step (nothing synchronises inside it) when the model is on a GPU, else
from the monotonic clock.

The recorder never changes results: hooks return nothing and the saved-tensor hooks store the
tensor itself. Hooks exist only inside ``rec.step()``: they are registered when it opens (so
after FSDP's own hooks) and removed when it closes, so an attached recorder costs nothing
between recorded steps. Its own cost is in ``rec.overhead()`` and in the trace's meta.recorder.

CUDA (designed, not run here: no GPU on the machines this was written on): marks are CUDA events
recorded on the current (compute) stream and read after the step, so a unit's compute is the
compute stream's time between its hooks; FSDP's waits for an all-gather are stream waits on that
stream, so the time between the events recorded around FSDP's methods is the stream's wait and
copy-out, excluded like on the CPU. Collective bounds are those compute-stream events too (issue
to ready as the compute stream sees it), not events on FSDP's all-gather stream.
"""

import contextlib
import inspect
import json
import os
import tempfile
import time
import warnings
import weakref

import torch

# apply_policy(model, "policy.json"): a policy exported by `fsdplab export-policy --format json`,
# applied to a live FSDP2 model (the same code export-policy writes into its scripts).
from fsdplab_apply import PolicyError, apply_policy  # noqa: E402 (beside this file)

__all__ = [
    "Recorder",
    "trace_dtype",
    "rank_path",
    "detect_units",
    "apply_policy",
    "PolicyError",
    "__version__",
]
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


def _write_atomic(out, text):
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
        "fw_calls",
        "bw_done",
        "bw_frame",
        "grads_seen",
        "remaining",
        "trainable_slots",
        "param_bytes",
        "last_key",
        "sparse",
        "grad_marks",
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
        self.fw_calls = 0  # ordinary forward calls in this microbatch
        self.bw_done = 0  # backward computes emitted in this microbatch
        self.bw_frame = None  # the open backward frame
        self.grads_seen = set()  # parameter slots whose gradient arrived in this backward pass
        self.remaining = 0  # gradients still to come before post_backward
        self.trainable_slots = 0  # parameter slots that need a gradient (counted at step start)
        self.param_bytes = 0  # bytes of the unit's trainable parameters (reduce-scatter size)
        # One gradient hook per unit instead of one per parameter (see _hook_params):
        self.last_key = None  # the slot whose gradient came last when the backward last ended
        self.sparse = False  # this step hooks only last_key's parameter
        self.grad_marks = ()  # the other slots' gradients when this backward began


class _Frame:
    """An open span of one unit's compute: the time and saved bytes attributed to it.

    phase "fsdp" is FSDP's own work (no unit): its time is excluded from every compute. An
    inside recomputation frame (`inside`) stays open between the modules it recomputes (`leaf`
    is the module running now, None between two of them). A forward or recompute frame collects
    the tensors autograd saves while it is the innermost (`tensors`); they are measured into
    `saved` when the frame's compute is emitted."""

    __slots__ = (
        "unit",
        "phase",
        "segments",
        "saved",
        "tensors",
        "leaf",
        "inside",
        "name",
        "grads0",
        "memory",
    )

    def __init__(self, unit, phase, leaf=None, inside=False, name=None):
        self.unit = unit  # _Unit, or None for work outside every unit (the loss) or FSDP's
        self.phase = phase
        self.segments = []  # (mark, mark) pairs
        self.saved = 0
        self.tensors = [] if phase == "forward" or phase == "recompute" else None
        self.leaf = leaf  # the module of an inside recomputation running now
        self.inside = inside
        self.name = name  # the event's label ("fsdp": FSDP's own work outside collectives)
        self.grads0 = None  # memory steps, backward: the unit's gradients when the frame opened
        self.memory = None  # memory steps: (saved, released, peak, grad bytes), when emitted


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


def _dispatch_mode_class():
    """torch's TorchDispatchMode where storages can be followed (torch >= 2.0), or None."""
    if not hasattr(torch.Tensor, "untyped_storage"):
        return None
    try:
        from torch.utils._python_dispatch import TorchDispatchMode
    except ImportError:
        return None
    return TorchDispatchMode


def _storage(t):
    """The untyped storage of a plain tensor, or None (no storage, or a tensor subclass)."""
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError, AttributeError):
        return None


def _make_memory_probe():
    """The memory probe of a memory step: a dispatch mode that adds the bytes of every storage an
    operator creates and takes them off when the storage is freed (a weak reference's callback),
    so that each mark can read what is allocated now and the most that was since the last mark.
    Tensor subclasses (DTensor) are left to unwrap into the operators it counts, as
    FSDPMemTracker does. None when torch has no dispatch modes."""
    base = _dispatch_mode_class()
    if base is None:
        return None

    class _MemoryProbe(base):
        def __init__(self):
            super().__init__()
            self.live = 0
            self.peak = 0
            self._held = {}  # id(storage) -> (weak reference, bytes)
            # > 0 while FSDP's own methods run: what they create (gather buffers, gradient
            # copies) is the plan's, so it is neither counted nor its free taken off later.
            self.foreign = 0
            self._foreign = {}  # id(storage) -> weak reference

        def read(self):
            """(bytes allocated now, the most allocated since the last read)."""
            peak, self.peak = self.peak, self.live
            return self.live, peak

        def _freed(self, key):
            entry = self._held.pop(key, None)
            if entry is not None:
                self.live -= entry[1]

        def _count(self, t):
            st = _storage(t)
            if st is None:
                return
            key = id(st)
            entry = self._held.get(key)
            if entry is not None and entry[0]() is st:
                return
            ref = self._foreign.get(key)
            if ref is not None and ref() is st:
                return
            if self.foreign > 0:
                self._foreign[key] = weakref.ref(st, lambda _, k=key: self._foreign.pop(k, None))
                return
            n = int(st.nbytes())
            if n <= 0:
                return
            self._held[key] = (weakref.ref(st, lambda _, k=key: self._freed(k)), n)
            self.live += n
            if self.live > self.peak:
                self.peak = self.live

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if any(t is not torch.Tensor and t is not torch.nn.Parameter for t in types):
                return NotImplemented
            out = func(*args, **(kwargs or {}))
            # An output on an input's storage (a view, an in-place or out= result) allocated
            # nothing: a parameter's transpose is not new memory.
            inputs = _tensors_in(kwargs, _tensors_in(args, [])) if kwargs else _tensors_in(args, [])
            reused = {st.data_ptr() for st in map(_storage, inputs) if st is not None}
            for t in _tensors_in(out, []):
                st = _storage(t)
                if st is not None and st.data_ptr() not in reused:
                    self._count(t)
            return out

    return _MemoryProbe()


def _has_post_accumulate_grad_hook():
    return hasattr(torch.Tensor, "register_post_accumulate_grad_hook")


def _has_hook_kwarg(name):
    """Whether register_forward_hook takes `name` (torch >= 2.0: prepend; >= 2.1: always_call)."""
    try:
        return name in inspect.signature(torch.nn.Module.register_forward_hook).parameters
    except (TypeError, ValueError):
        return False


def _has_always_call():
    """Whether forward hooks can run when the forward raises (torch >= 2.1): what closes a
    recomputation that a non-reentrant checkpoint stops early."""
    return _has_hook_kwarg("always_call")


def _fsdp_state_and_groups(module):
    """FSDP2's state of a module and its parameter groups (one per dtype / mesh), found by
    attribute so that nothing of torch.distributed.fsdp is imported."""
    get_state = getattr(module, "_get_fsdp_state", None)
    if get_state is None:
        return None, []
    try:
        state = get_state()
    except (AssertionError, AttributeError, RuntimeError):
        return None, []
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:  # earlier FSDP2: one group per state
        group = getattr(state, "_fsdp_param_group", None)
        groups = [group] if group is not None else []
    return state, list(groups)


# FSDP2's methods whose time is FSDP's own work, bracketed while recording. A parameter group's
# methods are looked up on the instance each time FSDP calls them, so an instance attribute
# wraps them; the state's hooks that are registered once (its forward hooks) call these.
_FSDP_GROUP_METHODS = (
    "pre_forward",
    "post_forward",
    "pre_backward",
    "post_backward",
    "unshard",
    "wait_for_unshard",
    "reshard",
    "finalize_backward",
)
_FSDP_STATE_METHODS = ("_root_pre_forward", "_pre_backward", "_root_post_backward_final_callback")
# The FSDP methods that may run before anything of a microbatch was recorded (the root's forward
# prologue, an explicit prefetch); the others, outside a microbatch, ran after its backward_end.
_FSDP_OPENS_PASS = frozenset(("_root_pre_forward", "pre_forward", "unshard", "wait_for_unshard"))
_MISSING = object()
_NO_INPUT_GRAD_WARNING = "Full backward hook is firing when gradients are computed with respect"


def _fsdp2_configuration(units):
    """What FSDP2 was configured with, per unit, read from its state once it has run (the root's
    choice is made at its lazy init, on the first forward): (meta.recorded_policy, the explicit
    prefetch lists), each None when nothing is known. A parameter group keeps its parameters
    after forward when its post_forward_mesh_info is None (reshard_after_forward=False, and the
    root by default); an int reshards to a smaller mesh, which still frees the full parameters
    (true). A unit without FSDP2 state, not yet initialised, or whose groups disagree is left
    out: unknown. The prefetch lists (set_modules_to_forward_prefetch / _backward_prefetch) name
    units, informational."""
    states = [(u.name, *_fsdp_state_and_groups(u.module)) for u in units]
    unit_of_state = {}
    for name, state, _ in states:
        if state is not None:
            unit_of_state.setdefault(id(state), name)
    recorded, lists = {}, {}
    for name, state, groups in states:
        if state is None or getattr(state, "_is_root", None) is None:
            continue
        keeps = {getattr(g, "post_forward_mesh_info", _MISSING) is None for g in groups}
        has_info = all(hasattr(g, "post_forward_mesh_info") for g in groups)
        if groups and has_info and len(keeps) == 1:
            recorded[name] = {"reshard_after_forward": not keeps.pop()}
        for phase in ("forward", "backward"):
            targets = getattr(state, f"_states_to_{phase}_prefetch", None) or []
            named = [unit_of_state.get(id(t)) for t in targets]
            if named:
                lists.setdefault(name, {})[phase] = [n for n in named if n is not None]
    return ({"units": recorded} if recorded else None), (lists or None)


def _all_gather_bytes(result, u):
    """The bytes an all-gather produces (FSDP's padded output), else the unit's parameters."""
    out = getattr(result, "all_gather_output", None)
    if isinstance(out, torch.Tensor):
        return int(out.numel() * out.element_size())
    return u.param_bytes

def _optimizer_meta(optimizer):
    """(meta.optimizer, whether the optimizer's parameters are fp32) for an optimizer or name."""
    if isinstance(optimizer, str):
        if optimizer not in ("adam", "sgd", "none"):
            raise ValueError(
                f"fsdplab_record: optimizer={optimizer!r}: expected 'adam', 'sgd' or 'none', "
                "or a torch.optim.Optimizer"
            )
        return optimizer, True
    cls = type(optimizer).__name__
    groups = getattr(optimizer, "param_groups", None)
    if groups is None:
        raise ValueError(f"fsdplab_record: optimizer={cls}: expected a torch.optim.Optimizer")
    if cls in ("Adam", "AdamW"):
        name = "adam"
    elif cls == "SGD":
        name = "sgd" if any(g.get("momentum", 0) for g in groups) else "none"
    else:
        raise ValueError(
            f"fsdplab_record: optimizer={cls}: only Adam, AdamW and SGD are known; pass "
            "optimizer='adam', 'sgd' or 'none' for the state it keeps"
        )
    params = [p for g in groups for p in g["params"]]
    master_fp32 = bool(params) and all(p.dtype == torch.float32 for p in params)
    return name, master_fp32


class Recorder:
    """Records the steps run inside ``with rec.step():`` and writes them with ``save``.

    Args:
      model: the module to record (its root is always a unit).
      units: None to detect (FSDP2, Megatron-FSDP, else the root plus each child of the first
        ModuleList), a list of module names relative to `model` (e.g. ["layers.0", "layers.1"]),
        or a predicate ``f(name, module) -> bool``.
      root_name: the trace name of the root unit; other units are ``root_name + "." + name``.
      timing: "auto" (CUDA events when the model has CUDA parameters), "cuda" or "cpu".
      hooks: "auto" (post-accumulate-grad hooks where this PyTorch has them) or "tensor" (hooks
        on parameter gradients, as on PyTorch 1.13). Either way a unit's backward starts at a
        hook on the gradient of its outputs.
      saved_bytes: measure the activations autograd saves (saved-tensor hooks).
      param_dtype: trace dtype for every parameter ("bf16", ...), e.g. the gather dtype of a
        mixed-precision policy; None reads each parameter's dtype.
      fsdp_work: with FSDP2, write FSDP's own work outside its collectives (copies in and out of
        the gather buffers, casts, gradient division) as computes without a unit, so that a
        replay keeps that time; False drops it. Never part of a unit's compute.
      memory_steps: how many steps, from the first, measure memory with the dispatch-mode count
        (their computes run several times slower); 0: only what the saved-tensor hooks see.
      optimizer: the training's optimizer (a torch.optim.Optimizer, or "adam", "sgd", "none"),
        written as meta.optimizer so that memory reports count its sharded state: Adam and
        AdamW are "adam", SGD with momentum "sgd", SGD without momentum "none". Its parameters'
        dtype gives meta.master_weights: "fp32" when they are fp32 while the trace's parameters
        are not (param_dtype, or FSDP2 mixed precision), else "none". None writes neither key.
        Given the optimizer itself, its step() and zero_grad() inside ``rec.step()`` are timed
        and written as the step's optimizer compute (phase "optimizer", no unit, after the
        backward_end of the step's last microbatch): a zero_grad() at the start of the step, as
        many loops call it, counts in the same step's optimizer compute as the step() after its
        backward.

    Create it after ``fully_shard``: FSDP2 units are found by what fully_shard made of the
    modules. A recorder created before is re-detected when its first step opens (with a
    warning); once steps are recorded, a model whose units changed is an error.
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
        fsdp_work=True,
        optimizer=None,
        memory_steps=1,
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
        self._optimizer = _optimizer_meta(optimizer) if optimizer is not None else None
        # The optimizer whose step() and zero_grad() are timed inside rec.step() (an instance;
        # a name only says what state it keeps).
        self._optimizer_obj = optimizer if hasattr(optimizer, "param_groups") else None
        self._optimizer_patched = []  # (attribute, previous instance value or _MISSING)
        self._optimizer_seen = False  # some recorded step ran the optimizer
        self._fsdp_work = fsdp_work
        self._root_name = root_name
        self._units_arg = units
        self._saved_bytes = saved_bytes and hasattr(torch.autograd.graph, "saved_tensors_hooks")
        if not isinstance(memory_steps, int) or memory_steps < 0:
            raise ValueError(
                f"fsdplab_record: memory_steps={memory_steps!r}: expected a number of steps >= 0"
            )
        self._memory_steps = memory_steps if _dispatch_mode_class() is not None else 0
        self._probe = None  # the memory probe of the step being recorded, in a memory step
        self._mem = []  # memory steps: (allocated, most allocated since the last mark) per mark
        if timing == "auto":
            on_cuda = any(p.is_cuda for p in model.parameters())
            timing = "cuda" if on_cuda and torch.cuda.is_available() else "cpu"
        self._timing = timing
        self._post_accumulate = hooks == "auto" and _has_post_accumulate_grad_hook()
        self._always_call = _has_always_call()
        self._prepend = _has_hook_kwarg("prepend")
        self._handles = []
        self._leaf_handles = []
        self._hooked_params = {}  # id(tensor) -> (weakref, handle)
        self._fsdp_patched = []  # (object, attribute, previous instance value or _MISSING)
        self._steps = []
        self._active = False
        self._hook_calls = 0
        self._hook_ns = 0
        self._fsdp_ns = 0  # wall time inside FSDP's own methods while recording
        self._detect()

    def _detect(self):
        qualnames, self.detected_by = detect_units(self._model, self._units_arg)
        self._units = self._build_units(qualnames, self._root_name)
        self._fsdp_modules = {id(m) for m in self._model.modules() if _is_fsdp2_module(m)}
        self._classes = [type(self._model)] + [type(u.module) for u in self._units]
        # FSDP2 swaps unsharded parameters in during forward: hook those as they appear.
        self._lazy_params = bool(self._fsdp_modules)

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
        self._check_model_unchanged()
        self._begin_step()
        try:
            with warnings.catch_warnings():
                # torch 2.x warns when the backward hook of a unit without parameters fires with
                # no input that needs a gradient: the recorder's hook, which expects that.
                warnings.filterwarnings("ignore", message=_NO_INPUT_GRAD_WARNING)
                with contextlib.ExitStack() as stack:
                    if self._probe is not None:
                        stack.enter_context(self._probe)
                    if self._saved_bytes:
                        stack.enter_context(
                            torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
                        )
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
        if self._optimizer_obj is not None and self._steps and not self._optimizer_seen:
            warnings.warn(
                "fsdplab_record: the optimizer given to Recorder never ran inside rec.step(): "
                "the trace has no optimizer step (call opt.step() and opt.zero_grad() inside "
                "the `with rec.step():` block)",
                stacklevel=2,
            )
        world_size, rank = 1, 0
        dist = getattr(torch, "distributed", None)
        if dist is not None and dist.is_available() and dist.is_initialized():
            world_size, rank = dist.get_world_size(), dist.get_rank()
        units = self._units_json()
        recorder = {
            "torch": str(torch.__version__),
            "units_from": self.detected_by,
            "timing": self._timing,
            "pre_backward": "tensor-hook",
            "post_backward": ("post-accumulate-grad-hook" if self._post_accumulate else "grad-hook"),
            **self.overhead(),
        }
        if self._lazy_params:
            recorder["fsdp_excluded_us"] = round(self._fsdp_ns / 1000.0, 3)
        meta = {"source": "torch", "world_size": world_size, "rank": rank}
        meta.update(self._run_where())
        meta["recorder"] = recorder
        recorded_policy, prefetch_lists = _fsdp2_configuration(self._units)
        if recorded_policy is not None:
            meta["recorded_policy"] = recorded_policy
        if prefetch_lists is not None:
            recorder["fsdp2_prefetch_lists"] = prefetch_lists
        if self._optimizer is not None:
            name, master_fp32 = self._optimizer
            meta["optimizer"] = name
            trace_dtypes = {p["dtype"] for u in units for p in u["params"]}
            meta["master_weights"] = "fp32" if master_fp32 and trace_dtypes - {"fp32"} else "none"
        if self._memory_steps:
            recorder["memory_steps"] = min(self._memory_steps, len(self._steps))
        steps = [self._step_dict(s) for s in self._steps]
        _carry_memory(steps)
        return {
            "format": _TRACE_FORMAT,
            "version": _TRACE_VERSION,
            "meta": meta,
            "units": units,
            "steps": steps,
        }

    def _run_where(self):
        """meta.device ("cuda" when the model has CUDA parameters, else "cpu") and, in a process
        group, meta.backend: the backend that serves that device ("gloo", "nccl", ...)."""
        device = "cuda" if any(p.is_cuda for p in self._model.parameters()) else "cpu"
        where = {"device": device}
        dist = getattr(torch, "distributed", None)
        if dist is not None and dist.is_available() and dist.is_initialized():
            backend = str(dist.get_backend())
            # A group with a backend per device reads "cpu:gloo,cuda:nccl".
            per_device = dict(p.split(":", 1) for p in backend.split(",") if ":" in p)
            where["backend"] = per_device.get(device, backend)
        return where

    def _units_json(self):
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
        return units

    def model(self):
        """The units and their parameters, ``{"format": "fsdplab.model", "version": 1, "units":
        [...]}`` (units as in a trace): what ``fsdplab import-kineto --model-json`` reads when the
        profiler did not record shapes. Needs no recorded step."""
        return {"format": "fsdplab.model", "version": 1, "units": self._units_json()}

    def save_model(self, path):
        """Writes model() to `path`, whole or not at all; returns `path`."""
        return _write_atomic(os.fspath(path), json.dumps(self.model(), indent=1) + "\n")

    def save(self, path):
        """Writes the trace whole or not at all; returns the path written (see rank_path)."""
        trace = self.trace()
        out = rank_path(path, trace["meta"]["rank"], trace["meta"]["world_size"])
        return _write_atomic(out, _dumps(trace))

    def remove(self):
        """Removes every hook the recorder installed (none is left outside rec.step() anyway)."""
        self._remove_hooks()

    # ----------------------------------------------------------------------------------------
    # Model structure

    def _check_model_unchanged(self):
        """fully_shard applied after the recorder was created: detect the units again (a warning
        says so), or fail if steps were already recorded with the old units. fully_shard changes
        the class of the modules it shards (the root and the units, as FSDP2 is used): a cheap
        look at those comes first."""
        classes = [type(self._model)] + [type(u.module) for u in self._units]
        if classes == self._classes:
            return
        self._classes = classes
        now = {id(m) for m in self._model.modules() if _is_fsdp2_module(m)}
        if now == self._fsdp_modules:
            return
        if self._steps:
            raise RuntimeError(
                "fsdplab_record: the model's FSDP2 modules changed (fully_shard after steps were "
                "recorded); create a new Recorder after fully_shard"
            )
        before = self.detected_by
        self._detect()
        warnings.warn(
            f"fsdplab_record: fully_shard was applied after the Recorder was created; units "
            f"detected again ({before} -> {self.detected_by}: {len(self._units)} units). Create "
            "the Recorder after fully_shard.",
            stacklevel=3,
        )

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
                if p.requires_grad:
                    owner.param_bytes += p.numel() * p.element_size()
        return units

    def _register_hooks(self):
        """Registered when a step opens, after whatever hooks FSDP has, and removed when it
        closes."""
        always = {"always_call": True} if self._always_call else {}
        # Before FSDP's forward hooks: FSDP's unshard comes after the unit's pre_forward and its
        # reshard after its post_forward (both bracketed, so not compute), and the post-forward
        # hook sees the unsharded parameters (autograd's leaves), whose gradients end the
        # unit's backward before FSDP reduce-scatters them.
        first = {"prepend": True} if self._prepend else {}
        for u in self._units:
            m = u.module
            self._handles.append(m.register_forward_pre_hook(self._make_pre_forward(u), **first))
            self._handles.append(
                m.register_forward_hook(self._make_post_forward(u), **always, **first)
            )
            u.sparse = False
            if not u.trainable:
                self._handles.append(m.register_full_backward_hook(self._make_module_backward(u)))
            elif not self._lazy_params:
                self._hook_params(u, only=u.last_key)
        if self._lazy_params:
            self._patch_fsdp()
        self._patch_optimizer()

    def _remove_hooks(self):
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._remove_leaf_hooks()
        for _, handle in self._hooked_params.values():
            handle.remove()
        self._hooked_params.clear()
        self._unpatch_fsdp()
        self._unpatch_optimizer()

    def _install_leaf_hooks(self):
        # Forwards of the modules that hold a unit's parameters matter only during backward
        # (inside recomputation): global module hooks, installed for the backward only, cost the
        # forward nothing.
        if self._leaf_owner and not self._leaf_handles:
            from torch.nn.modules import module as module_lib

            always = {"always_call": True} if self._always_call else {}
            self._leaf_handles = [
                module_lib.register_module_forward_pre_hook(self._leaf_pre),
                module_lib.register_module_forward_hook(self._leaf_post, **always),
            ]

    def _remove_leaf_hooks(self):
        for h in self._leaf_handles:
            h.remove()
        self._leaf_handles = []

    # ----------------------------------------------------------------------------------------
    # FSDP2: its own work is bracketed and excluded; its collectives are measured.

    def _patch_fsdp(self):
        seen = set()
        for u in self._units:
            state, groups = _fsdp_state_and_groups(u.module)
            if state is None or id(state) in seen:
                continue
            seen.add(id(state))
            self._fsdp_states.append(state)
            for name in _FSDP_STATE_METHODS:
                self._patch(state, name, u, None)
            for g in groups:
                for name in _FSDP_GROUP_METHODS:
                    self._patch(g, name, u, g)

    def _patch(self, obj, name, u, group):
        original = getattr(obj, name, None)
        if original is None or not callable(original):
            return
        previous = obj.__dict__.get(name, _MISSING)

        def wrapper(*args, **kwargs):
            if not self._active:
                return original(*args, **kwargs)
            token = self._fsdp_enter(u, name, group)
            try:
                return original(*args, **kwargs)
            finally:
                self._fsdp_exit(token)

        obj.__dict__[name] = wrapper
        self._fsdp_patched.append((obj, name, previous))

    def _unpatch_fsdp(self):
        for obj, name, previous in reversed(self._fsdp_patched):
            if previous is _MISSING:
                obj.__dict__.pop(name, None)
            else:
                obj.__dict__[name] = previous
        self._fsdp_patched.clear()

    def _fsdp_enter(self, u, name, group):
        t0 = time.perf_counter_ns()
        if self._events is None and name not in _FSDP_OPENS_PASS:
            return None  # after backward_end (nothing of a microbatch is open): not recorded
        m = self._mark()
        if self._probe is not None:
            self._probe.foreign += 1
        frame = _Frame(None, "fsdp")
        self._stack.append(frame)
        if self._fsdp_depth == 0:
            self._fsdp_collectives = []  # (start, end) marks of collectives inside this bracket
        self._fsdp_depth += 1
        token = [frame, u, name, group, m, t0, None]
        if group is not None:
            if name == "unshard":
                token[6] = getattr(group, "_all_gather_result", None)
            elif name == "post_backward":
                token[6] = str(getattr(group, "_training_state", ""))
        self._hook_ns += time.perf_counter_ns() - t0
        return token

    def _fsdp_exit(self, token):
        if token is None or not self._active:
            return
        t1 = time.perf_counter_ns()
        frame, u, name, group, start, t0, before = token
        m = self._mark()
        if self._probe is not None:
            self._probe.foreign = max(self._probe.foreign - 1, 0)
        self._stack.remove(frame)
        if name == "unshard" and before is None and self._world_size > 1:
            result = getattr(group, "_all_gather_result", None)
            if result is not None:  # an all-gather was issued
                nbytes = _all_gather_bytes(result, u)
                if getattr(result, "all_gather_work", None) is None:
                    self._emit_collective("all_gather", u, nbytes, start, m)
                else:  # asynchronous: it ends when FSDP has waited for it
                    self._pending_gathers[id(group)] = (u, nbytes, start)
        elif name == "wait_for_unshard":
            pending = self._pending_gathers.pop(id(group), None)
            if pending is not None:
                self._emit_collective("all_gather", pending[0], pending[1], pending[2], m)
        elif name == "post_backward" and self._world_size > 1 and u.param_bytes:
            if not before.endswith("POST_BACKWARD") and u.index not in self._reduced:
                self._reduced.add(u.index)
                self._emit_collective("reduce_scatter", u, u.param_bytes, start, m)
        self._fsdp_depth -= 1
        if self._fsdp_depth == 0:  # FSDP's methods nest (pre_forward calls unshard): once
            self._fsdp_ns += t1 - t0
            self._emit_fsdp_work(start, m)
        self._hook_ns += time.perf_counter_ns() - t1
        self._hook_calls += 1

    def _emit_collective(self, kind, u, nbytes, start, end):
        self._events.append(("collective", (kind, u, nbytes, start, end), end))
        if self._fsdp_depth > 0:
            self._fsdp_collectives.append((start, end))

    def _emit_fsdp_work(self, start, end):
        """FSDP's own work outside its collectives (copying shards in and out of the gather
        buffers, casting, dividing gradients) keeps the compute stream busy too: one compute
        without a unit for the outermost bracket less the collectives inside it (a segment given
        backwards subtracts). Traces have no event labels yet (the reader rejects "name"), so it
        reads like the loss: work outside every unit."""
        if not self._fsdp_work:
            return
        frame = _Frame(None, "backward" if self._in_backward else "forward", name="fsdp")
        frame.segments.append((start, end))
        frame.segments.extend((b, a) for a, b in self._fsdp_collectives if a >= start)
        self._events.append(("compute", frame, start))

    # ----------------------------------------------------------------------------------------
    # The optimizer step: step() and zero_grad() are timed while a step is recorded.

    def _patch_optimizer(self):
        opt = self._optimizer_obj
        if opt is None:
            return
        for name in ("step", "zero_grad"):
            original = getattr(opt, name, None)
            if original is None or not callable(original):
                continue
            previous = opt.__dict__.get(name, _MISSING)
            opt.__dict__[name] = self._make_optimizer_wrapper(original)
            self._optimizer_patched.append((name, previous))

    def _make_optimizer_wrapper(self, original):
        def wrapper(*args, **kwargs):
            if not self._active:
                return original(*args, **kwargs)
            if self._events is not None:
                # Inside a pass (before its backward_end): not the optimizer step of a step.
                warnings.warn(
                    "fsdplab_record: the optimizer ran while a forward or backward was open; "
                    "its time is not recorded as the optimizer step",
                    stacklevel=2,
                )
                return original(*args, **kwargs)
            start = self._clock.mark()
            try:
                return original(*args, **kwargs)
            finally:
                self._optimizer_spans.append((start, self._clock.mark()))

        return wrapper

    def _unpatch_optimizer(self):
        opt = self._optimizer_obj
        for name, previous in reversed(self._optimizer_patched):
            if previous is _MISSING:
                opt.__dict__.pop(name, None)
            else:
                opt.__dict__[name] = previous
        self._optimizer_patched.clear()

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
        self._pending_gathers = {}  # id(FSDP param group) -> (unit, bytes, start mark)
        self._reduced = set()  # units whose reduce-scatter this backward has recorded
        self._fsdp_states = []
        self._fsdp_depth = 0  # FSDP methods open now (they nest)
        self._fsdp_collectives = []
        self._end_requeued = 0
        self._optimizer_spans = []  # (start, end) marks of optimizer.step() and zero_grad()
        self._world_size = 1
        dist = getattr(torch, "distributed", None)
        if dist is not None and dist.is_available() and dist.is_initialized():
            self._world_size = dist.get_world_size()
        self._param_ptrs = set()  # where the parameters are now (the units' slots hold them all)
        for u in self._units:
            u.trainable_slots = 0  # FSDP swaps a slot's parameter, never whether it needs a grad
            for module, attr in u.param_slots:
                p = module._parameters.get(attr)
                if p is not None:
                    u.trainable_slots += p.requires_grad
                    with contextlib.suppress(RuntimeError, NotImplementedError, TypeError):
                        self._param_ptrs.add(p.data_ptr())
        self._mem = []
        self._probe = _make_memory_probe() if len(self._steps) < self._memory_steps else None
        self._reset_microbatch()
        self._register_hooks()
        self._active = True

    def _reset_microbatch(self):
        for u in self._units:
            u.fw_depth = 0
            u.fw_calls = 0
            u.bw_done = 0
            u.bw_frame = None
            u.grads_seen = set()

    def _clear_step(self):
        self._remove_hooks()
        self._probe = None
        self._clock = None
        self._microbatches = None
        self._events = None
        self._stack = None
        self._gap = None
        self._in_backward = False

    def _mark(self, settle=True):
        """Closes the running time segment: it belongs to the innermost open frame (or, before
        the backward, to the work outside every unit). `settle`: an inside recomputation waiting
        between two of its modules ends first (the time since its last module is not its own)."""
        if settle and self._stack:
            top = self._stack[-1]
            if top.inside and top.leaf is None:
                self._stack.pop()
                self._emit_compute(top)
        m = self._clock.mark()
        if self._probe is not None:
            self._mem.append(self._probe.read())
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
            if self._probe is not None:
                self._measure_memory(self._gap)
            self._events.append(("compute", self._gap, self._gap.segments[0][0]))
            self._gap = None
        self._events.append((op, unit, m))

    def _emit_compute(self, frame):
        if frame.tensors:
            self._measure_saved(frame)
        frame.tensors = None
        if self._probe is not None and frame.name != "fsdp":
            self._measure_memory(frame)
        first = frame.segments[0][0] if frame.segments else self._last_mark
        self._events.append(("compute", frame, first))

    def _end_step(self):
        open_frames = [f for f in self._stack if f.unit is not None] if self._stack else []
        if self._events is not None and open_frames:
            open_units = ", ".join(f.unit.name for f in open_frames)
            raise RuntimeError(
                f"fsdplab_record: the step ended with units still open ({open_units}): a forward "
                "or backward was interrupted"
            )
        # Read the clock now (CUDA: one synchronize, after the step); build the events on demand.
        if self._optimizer_spans and self._microbatches:
            self._optimizer_seen = True
        return (self._microbatches, self._clock.times_us(), self._optimizer_spans)

    @staticmethod
    def _step_dict(raw_step):
        microbatches, times, optimizer_spans = raw_step
        step = {"microbatches": []}
        for raw in microbatches:
            events = []
            for op, obj, m in raw:
                if op == "collective":
                    kind, u, nbytes, a, b = obj
                    events.append(
                        {
                            "op": "collective",
                            "kind": kind,
                            "unit": u.name,
                            "bytes": nbytes,
                            "start_us": round(times[a], 3),
                            "end_us": round(max(times[b], times[a]), 3),
                        }
                    )
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
                        saved, released, peak, grads = frame.memory
                        if saved:
                            ev["saved_bytes"] = saved
                        ev["released_bytes"] = released
                        if peak:
                            ev["peak_bytes"] = peak
                        if grads is not None and frame.phase == "backward":
                            ev["grad_bytes"] = grads
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

    # ----------------------------------------------------------------------------------------
    # Hooks. Each returns None (results are never changed) and returns at once outside a step.

    def _make_pre_forward(self, u):
        def hook(module, inputs):
            if not self._active:
                return
            t0 = time.perf_counter_ns()
            m = self._mark()
            self._split_outer(u)
            if self._in_backward:
                phase = "recompute"
                u.recompute_seen.add("reentrant")
            else:
                phase = "forward"
                u.fw_calls += 1
            self._stack.append(_Frame(u, phase))
            u.fw_depth += 1
            self._emit("pre_forward", u, m)
            self._hook_calls += 1
            self._hook_ns += time.perf_counter_ns() - t0

        return hook

    def _make_post_forward(self, u):
        # Registered with always_call where torch has it: output is None when the forward raised
        # (a non-reentrant checkpoint stopping its recomputation early).
        def hook(module, inputs, output):
            if not self._active:
                return
            t0 = time.perf_counter_ns()
            frame = self._find_forward_frame(u)
            if frame is not None:
                m = self._mark()
                self._close_forward_frame(frame, m)
                if torch.is_grad_enabled() and output is not None:
                    self._hook_output_grads(u, output)
                    if u.trainable and self._lazy_params:
                        self._hook_params(u)
            self._hook_calls += 1
            self._hook_ns += time.perf_counter_ns() - t0

        return hook

    def _find_forward_frame(self, u):
        for i in range(len(self._stack) - 1, -1, -1):
            f = self._stack[i]
            if f.unit is u and f.phase in ("forward", "recompute") and not f.inside:
                return f
        return None  # already closed (a recomputation stopped early, closed by a later event)

    def _close_forward_frame(self, frame, m):
        self._stack.remove(frame)
        frame.unit.fw_depth -= 1
        self._emit_compute(frame)
        self._emit("post_forward", frame.unit, m)

    def _close_stopped_recomputations(self, m):
        """Recomputations still open when the backward goes on were stopped early by a
        non-reentrant checkpoint (torch without always_call forward hooks): they end here."""
        for f in [f for f in self._stack if f.phase == "recompute"]:
            if f.inside:
                self._stack.remove(f)
                self._emit_compute(f)
            else:
                self._close_forward_frame(f, m)

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

    def _hook_params(self, u, only=None):
        """Hooks the tensors the unit's parameters are now (FSDP2 swaps in unsharded ones during
        forward); each tensor once per step. `only`: the slot whose gradient came last when the
        unit's backward last ended, hooked alone (u.sparse); when its parameter is gone or needs
        no gradient now, every slot is.

        One hook per unit instead of one per parameter (a 6-layer transformer's 75 hooks cost
        about 0.3% of its step): the others' gradients are checked to have arrived when that one
        comes (_gradients_missing), and those that have not get their hooks then, so the
        unit's post_backward is where it would be with every parameter hooked."""
        hooked = 0
        for module, attr in u.param_slots:
            if only is not None and (id(module), attr) != only:
                continue
            p = module._parameters.get(attr)
            if p is None or not p.requires_grad:
                continue
            hooked += 1
            entry = self._hooked_params.get(id(p))
            if entry is None or entry[0]() is not p:
                self._hook_param(u, module, attr, p)
        if only is not None:
            u.sparse = hooked == 1
            if not u.sparse:
                self._hook_params(u)

    @staticmethod
    def _mark_gradients(u):
        """The gradients of the unit's other trainable slots as the backward begins (each with
        its version: accumulating into a gradient bumps it), for _gradients_missing."""
        marks = []
        for module, attr in u.param_slots:
            if (id(module), attr) == u.last_key:
                continue
            p = module._parameters.get(attr)
            if p is None or not p.requires_grad:
                continue
            g = p.grad
            marks.append((module, attr, g, None if g is None else g._version))
        u.grad_marks = marks

    @staticmethod
    def _gradients_missing(u):
        """The marked slots (_mark_gradients) whose gradient has not arrived since."""
        missing = []
        for module, attr, g, version in u.grad_marks:
            p = module._parameters.get(attr)
            if p is None:
                continue
            now = p.grad
            if now is None or (now is g and now._version == version):
                missing.append((module, attr))
        return missing

    def _hook_missing(self, u):
        """The learned slot's gradient came (or came before the unit's pre_backward): hooks the
        marked slots whose gradient has not, and returns how many. With any, the unit is no longer
        sparse: the last of them to come is learned as its last slot."""
        missing = self._gradients_missing(u)
        if missing:
            u.sparse = False
            u.last_key = None
            u.grad_marks = ()
            for module, attr in missing:
                self._hook_param(u, module, attr, module._parameters[attr])
        return len(missing)

    def _hook_param(self, u, module, attr, p):
        hook = self._make_param_grad(u, (id(module), attr))
        if self._post_accumulate:
            handle = p.register_post_accumulate_grad_hook(hook)
        else:
            handle = p.register_hook(hook)
        self._hooked_params[id(p)] = (weakref.ref(p), handle)

    def _make_module_backward(self, u):
        def hook(module, grad_input, grad_output):
            if not self._active or u.bw_frame is None:
                return
            if all(g is None for g in grad_input):
                # No input needs a gradient (torch 2.x calls the hook anyway, as soon as the
                # output's gradient is there): the unit's backward ends with the whole backward.
                return
            t0 = time.perf_counter_ns()
            self._post_backward(u, self._mark())
            self._hook_calls += 1
            self._hook_ns += time.perf_counter_ns() - t0

        return hook

    def _pre_backward(self, u):
        t0 = time.perf_counter_ns()
        m = self._mark()
        self._close_stopped_recomputations(m)
        if not self._in_backward:
            self._in_backward = True
            for v in self._units:
                v.grads_seen = set()
                if v.sparse:
                    self._mark_gradients(v)
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_end)
            self._install_leaf_hooks()
        top = self._stack[-1] if self._stack else None
        if top is not None and top.phase == "backward" and top.unit is not u:
            if not self._split_backward(top):
                self._split_outer(u)
        if u.bw_frame is not None:
            # Called again while still in backward (a shared unit): the earlier call's backward
            # compute ends here, unless it was already ended by another unit's pre_backward.
            self._split_backward(u.bw_frame)
            self._stack.remove(u.bw_frame)
            self._stack.append(u.bw_frame)
        else:
            u.bw_frame = _Frame(u, "backward")
            self._open_memory(u.bw_frame)
            if not u.trainable:
                u.remaining = 0
            elif u.sparse:
                # The learned slot alone is hooked: 1 to come, or (it came already) the others
                # that have not.
                u.remaining = 1 if u.last_key not in u.grads_seen else self._hook_missing(u)
            else:
                u.remaining = max(u.trainable_slots - len(u.grads_seen), 0)
            self._stack.append(u.bw_frame)
        self._emit("pre_backward", u, m)
        self._hook_calls += 1
        self._hook_ns += time.perf_counter_ns() - t0

    def _split_backward(self, frame):
        """A unit called more than once in forward has that many backward computes: when another
        backward starts over one of its calls' backward, that call's compute ends. Returns
        whether it did."""
        u = frame.unit
        if not frame.segments or u.fw_calls - u.bw_done <= 1:
            return False
        self._emit_compute(frame)
        u.bw_done += 1
        fresh = _Frame(u, "backward")
        self._open_memory(fresh)
        self._stack[self._stack.index(frame)] = fresh
        u.bw_frame = fresh
        return True

    def _split_outer(self, u):
        """Unit u's hook opens its work over an enclosing unit's (the root's forward or
        backward): that unit's compute so far ends here and goes on in a compute of its own
        later, so each compute is one contiguous run of a unit's own work, in program order (the
        root's loss and head backward come before its layers', its embedding's after)."""
        top = self._stack[-1] if self._stack else None
        if top is None or top.unit is None or top.inside or not top.segments:
            return
        if top.phase not in ("forward", "backward") or not _encloses(top.unit, u):
            return
        self._emit_compute(top)
        fresh = _Frame(top.unit, top.phase)
        if top.phase == "backward":
            self._open_memory(fresh)
            top.unit.bw_frame = fresh
        self._stack[-1] = fresh

    def _make_param_grad(self, u, key):
        # Run once per backward for each hooked parameter (one per unit once the last is learned,
        # every one of a unit that is not sparse): the whole hook in one function.
        def hook(_):
            if not self._active or not self._in_backward or key in u.grads_seen:
                return
            t0 = time.perf_counter_ns()
            u.grads_seen.add(key)
            if u.bw_frame is not None and u.remaining > 0:
                u.remaining = self._hook_missing(u) if u.sparse else u.remaining - 1
                if u.remaining == 0:
                    u.last_key = key
                    self._post_backward(u, self._mark())
            self._hook_calls += 1
            self._hook_ns += time.perf_counter_ns() - t0

        return hook

    def _post_backward(self, u, m):
        self._close_stopped_recomputations(m)
        frame = u.bw_frame
        u.bw_frame = None
        self._stack.remove(frame)
        self._emit_compute(frame)
        u.bw_done += 1
        self._emit("post_backward", u, m)

    def _fsdp_final_callback_pending(self):
        for state in self._fsdp_states:
            ctx = getattr(state, "_state_ctx", None)
            if getattr(ctx, "post_backward_final_callback_queued", False):
                return True
        return False

    def _backward_end(self):
        if not self._active or not self._in_backward:
            return
        if self._end_requeued < 4 and self._fsdp_final_callback_pending():
            # FSDP's own end-of-backward callback (the root's reduce-scatter, the wait for every
            # reduce-scatter) still has to run: end the microbatch after it.
            self._end_requeued += 1
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_end)
            return
        self._end_requeued = 0
        t0 = time.perf_counter_ns()
        m = self._mark()
        self._close_stopped_recomputations(m)
        # Units whose gradients did not all arrive (unused parameters) end with the backward.
        for frame in reversed([f for f in self._stack if f.phase == "backward"]):
            self._post_backward(frame.unit, m)
        self._emit("backward_end", None, m)
        self._remove_leaf_hooks()
        self._in_backward = False
        self._events = None
        self._last_mark = None
        self._gap = None
        self._pending_gathers = {}
        self._reduced = set()
        self._reset_microbatch()
        self._hook_calls += 1
        self._hook_ns += time.perf_counter_ns() - t0

    def _leaf_pre(self, module, inputs):
        owner = self._leaf_owner.get(id(module))
        if owner is None or not self._active or not self._in_backward or owner.fw_depth > 0:
            return
        top = self._stack[-1] if self._stack else None
        if top is not None and top.inside and top.unit is owner:
            if top.leaf is not None:
                return  # a nested module of the one running now
            # The next module of the same recomputation: one compute for all of them.
            t0 = time.perf_counter_ns()
            self._mark(settle=False)
            top.leaf = module
        else:
            t0 = time.perf_counter_ns()
            self._mark()
            owner.recompute_seen.add("inside")
            self._stack.append(_Frame(owner, "recompute", leaf=module, inside=True))
        self._hook_calls += 1
        self._hook_ns += time.perf_counter_ns() - t0

    def _leaf_post(self, module, inputs, output):
        # Registered with always_call where torch has it (an early-stopped recomputation).
        if not self._active or not self._stack or self._stack[-1].leaf is not module:
            return
        t0 = time.perf_counter_ns()
        self._mark(settle=False)
        self._stack[-1].leaf = None  # open until something else than its next module runs
        self._hook_calls += 1
        self._hook_ns += time.perf_counter_ns() - t0

    # Memory steps: what each compute did to the memory, from the probe's reading at each mark.
    @staticmethod
    def _grads_of(u):
        """{id(storage): bytes} of the gradients the unit's parameters hold now (FSDP2: the
        unsharded parameters' while the unit is unsharded)."""
        grads = {}
        for module, attr in u.param_slots:
            p = module._parameters.get(attr)
            g = getattr(p, "grad", None) if p is not None else None
            st = _storage(g) if g is not None else None
            if st is not None:
                grads[id(st)] = int(st.nbytes())
        return grads

    def _open_memory(self, frame):
        """A unit's backward frame opens in a memory step: the gradients already there."""
        if self._probe is not None and frame.unit is not None:
            frame.grads0 = self._grads_of(frame.unit)

    def _measure_memory(self, frame):
        """The compute's own memory curve over its segments (what ran between them, children,
        FSDP's brackets, is not its own): how far it rose above its start (peak) and where it
        ended (net); less, for a backward, the unit's gradients it produced, which the plan
        holds as gradients. The net is what it keeps (saved) or releases."""
        mem = self._mem
        base = 0
        top = 0
        for a, b in frame.segments:
            if b <= a or b >= len(mem):
                continue
            start = mem[a][0]
            live, peak = mem[b]
            top = max(top, base + peak - start)
            base += live - start
        grads = None
        if frame.grads0 is not None:
            grads = sum(n for k, n in self._grads_of(frame.unit).items() if k not in frame.grads0)
        net = base - (grads or 0)
        frame.memory = (max(net, 0), max(-net, 0), max(top, 0), grads)

    # Saved-tensor hooks. The pack hook runs for every tensor autograd saves (about 150 per step
    # of a 6-layer transformer), in the middle of the step's tensor work: it only hands the tensor
    # to the innermost open forward or recompute frame. The frame measures them when its compute
    # is emitted (_measure_saved): one loop instead of many cold calls. The tensors are saved for
    # the backward anyway, so holding them until then keeps no memory longer than autograd does.
    def _pack(self, t):
        stack = self._stack
        if stack:
            tensors = stack[-1].tensors
            if tensors is not None:
                tensors.append(t)
        return t

    def _measure_saved(self, frame):
        """Adds to frame.saved the bytes of the activations among the tensors saved in it, each
        storage once. Parameters (and views of them) are not activations."""
        t0 = time.perf_counter_ns()
        params = self._param_ptrs
        seen = set()
        saved = 0
        for t in frame.tensors:
            try:
                ptr = t.data_ptr()
            except (RuntimeError, NotImplementedError, TypeError):  # no storage to measure
                continue
            # Cheapest tests first: a parameter's own storage, then one already counted, then a
            # view of a parameter (a slice of MultiheadAttention's in_proj_weight starts elsewhere).
            if ptr in params:
                continue
            n = t.numel()
            key = (ptr, n, t.dtype)
            if key in seen:
                continue
            base = t._base if t._base is not None else t  # FSDP's unsharded parameters
            if not isinstance(base, torch.nn.Parameter):  # are not in _param_ptrs
                seen.add(key)
                saved += n * t.element_size()
        frame.saved += saved
        self._hook_calls += len(frame.tensors)
        self._hook_ns += time.perf_counter_ns() - t0

    @staticmethod
    def _unpack(t):
        return t


_MEMORY_KEYS = ("saved_bytes", "released_bytes", "peak_bytes", "grad_bytes")


def _memory_events(step):
    """Per microbatch, the events that carry memory (hooks and computes but FSDP's own work),
    and their shape (op, unit, phase, name): two steps that ran alike have the same shape."""
    out = []
    for mb in step["microbatches"]:
        events = [
            e
            for e in mb["events"]
            if e["op"] != "collective" and not (e["op"] == "compute" and e.get("name") == "fsdp")
        ]
        shape = [(e["op"], e.get("unit"), e.get("phase"), e.get("name")) for e in events]
        out.append((events, shape))
    return out


def _encloses(outer, u):
    """Whether unit `outer` is one of u's ancestors."""
    p = u.parent
    while p is not None:
        if p is outer:
            return True
        p = p.parent
    return False


def _carry_memory(steps):
    """A step recorded without the memory probe takes the memory of the last probed step before
    it when both ran alike (the same hooks and computes in each microbatch); otherwise it keeps
    what the saved-tensor hooks measured."""
    source = None
    for step in steps:
        mbs = _memory_events(step)
        probed = any("released_bytes" in e for events, _ in mbs for e in events)
        if probed:
            source = mbs
            continue
        if source is None or [shape for _, shape in mbs] != [shape for _, shape in source]:
            continue
        for (events, _), (from_events, _) in zip(mbs, source):
            for e, f in zip(events, from_events):
                if e["op"] != "compute":
                    continue
                for key in _MEMORY_KEYS:
                    e.pop(key, None)
                for key in _MEMORY_KEYS:
                    if key in f:
                        e[key] = f[key]


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
