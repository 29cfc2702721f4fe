"""Record what a PyTorch training step did as an fsdplab trace (``fsdplab.trace`` v1).

    from fsdplab.torch import Recorder
    rec = Recorder(model, optimizer=opt)  # units: detected, or units=[names]
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
    bytes, start_us, end_us; all-gather: from its issue to the end of the wait for it); a
    synchronous all-gather (a CPU run) carries its copy-out, FSDP's wait_for_unshard after it
    (the copy into the parameters and their swap), as ``copy_out_us``, which the simulator runs
    with each gather a policy makes; the rest of FSDP's work (copy-in, casts, the reshard, its
    hooks' Python) is written as computes without a unit (``fsdp_work``).

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
import json
import os
import warnings

import torch

from .fsdp2 import Fsdp2Mixin, fsdp2_configuration
from .hooks import (
    NO_INPUT_GRAD_WARNING,
    HookStateMachine,
    InstancePatches,
    has_always_call,
    has_hook_kwarg,
    has_post_accumulate_grad_hook,
)
from .memory import MemoryMixin, carry_memory, dispatch_mode_class
from .optimizer import OptimizerMixin, optimizer_meta
from .saved_tensors import SavedTensorsMixin, saved_tensors_hooks_available
from .units import DTYPE_NAMES, build_units, detect_units, is_fsdp2_module
from .writer import (
    TRACE_FORMAT,
    TRACE_VERSION,
    dumps,
    rank_path,
    step_dict,
    unit_entries,
    world_and_rank,
    write_atomic,
)

__all__ = ["Recorder", "__version__"]
__version__ = "1.0"


class Recorder(HookStateMachine, Fsdp2Mixin, OptimizerMixin, MemoryMixin, SavedTensorsMixin):
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
      fsdp_work: with FSDP2, write FSDP's own work outside its collectives and their copy-outs
        (casts, the reshard, its hooks' Python) as computes without a unit, so that a replay
        keeps that time; False drops it. Never part of a unit's compute.
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
            raise ValueError(f"fsdplab.torch: hooks={hooks!r}: expected 'auto' or 'tensor'")
        if timing not in ("auto", "cuda", "cpu"):
            raise ValueError(f"fsdplab.torch: timing={timing!r}: expected 'auto', 'cuda' or 'cpu'")
        if param_dtype is not None and param_dtype not in DTYPE_NAMES:
            raise ValueError(
                f"fsdplab.torch: param_dtype={param_dtype!r}: expected one of {DTYPE_NAMES}"
            )
        self._model = model
        self._param_dtype = param_dtype
        self._optimizer = optimizer_meta(optimizer) if optimizer is not None else None
        # The optimizer whose step() and zero_grad() are timed inside rec.step() (an instance;
        # a name only says what state it keeps).
        self._optimizer_obj = optimizer if hasattr(optimizer, "param_groups") else None
        self._optimizer_patches = InstancePatches()  # its step() and zero_grad(), while recording
        self._optimizer_seen = False  # some recorded step ran the optimizer
        self._fsdp_work = fsdp_work
        self._root_name = root_name
        self._units_arg = units
        self._saved_bytes = saved_bytes and saved_tensors_hooks_available()
        if not isinstance(memory_steps, int) or memory_steps < 0:
            raise ValueError(
                f"fsdplab.torch: memory_steps={memory_steps!r}: expected a number of steps >= 0"
            )
        self._memory_steps = memory_steps if dispatch_mode_class() is not None else 0
        self._probe = None  # the memory probe of the step being recorded, in a memory step
        self._mem = []  # memory steps: (allocated, most allocated since the last mark) per mark
        if timing == "auto":
            on_cuda = any(p.is_cuda for p in model.parameters())
            timing = "cuda" if on_cuda and torch.cuda.is_available() else "cpu"
        self._timing = timing
        self._post_accumulate = hooks == "auto" and has_post_accumulate_grad_hook()
        self._always_call = has_always_call()
        self._prepend = has_hook_kwarg("prepend")
        self._handles = []
        self._leaf_handles = []
        self._recompute_patch = None  # (_CheckpointFrame, its get_inputs) while patched
        self._hooked_params = {}  # id(tensor) -> (weakref, handle)
        # id(parameter): its hand-over hook is in self._handles (None: torch before 2.1).
        self._handover_hooked = (
            set() if hasattr(torch.Tensor, "register_post_accumulate_grad_hook") else None
        )
        self._fsdp_patches = InstancePatches()  # FSDP2's methods, bracketed while recording
        self._steps = []
        self._active = False
        self._hook_calls = 0
        self._hook_ns = 0
        self._hook_depth = 0
        self._fsdp_ns = 0  # wall time inside FSDP's own methods while recording
        self._detect()

    def _detect(self):
        qualnames, self.detected_by = detect_units(self._model, self._units_arg)
        self._units, self._leaf_owner = build_units(
            self._model, qualnames, self._root_name, self._param_dtype
        )
        self._fsdp_modules = {id(m) for m in self._model.modules() if is_fsdp2_module(m)}
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
            raise RuntimeError("fsdplab.torch: rec.step() is already open")
        self._check_model_unchanged()
        self._begin_step()
        try:
            with warnings.catch_warnings():
                # torch 2.x warns when the backward hook of a unit without parameters fires with
                # no input that needs a gradient: the recorder's hook, which expects that.
                warnings.filterwarnings("ignore", message=NO_INPUT_GRAD_WARNING)
                with contextlib.ExitStack() as stack:
                    if self._probe is not None:
                        stack.enter_context(self._probe)
                    if self._saved_bytes:
                        stack.enter_context(self._saved_tensors_hooks())
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
            warnings.warn("fsdplab.torch: no module of the model ran inside rec.step()")

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
                "fsdplab.torch: the optimizer given to Recorder never ran inside rec.step(): "
                "the trace has no optimizer step (call opt.step() and opt.zero_grad() inside "
                "the `with rec.step():` block)",
                stacklevel=2,
            )
        if self._steps and len(self._steps) <= self._memory_steps:
            warnings.warn(
                f"fsdplab.torch: every recorded step ({len(self._steps)}) measured memory "
                f"(memory_steps={self._memory_steps}): the memory probe slows a step's computes, "
                "so the trace's step time is not the run's; record more steps than memory_steps "
                "(the simulator's step time is the mean of the steps after the first)",
                stacklevel=2,
            )
        world_size, rank = world_and_rank()
        units = unit_entries(self._units)
        recorder = {
            "torch": str(torch.__version__),
            "units_from": self.detected_by,
            "timing": self._timing,
            "pre_backward": "tensor-hook",
            "post_backward": (
                "post-accumulate-grad-hook" if self._post_accumulate else "grad-hook"
            ),
            **self.overhead(),
        }
        if self._lazy_params:
            recorder["fsdp_excluded_us"] = round(self._fsdp_ns / 1000.0, 3)
        meta = {"source": "torch", "world_size": world_size, "rank": rank}
        meta.update(self._run_where())
        meta["recorder"] = recorder
        recorded_policy, prefetch_lists = fsdp2_configuration(self._units)
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
        steps = [step_dict(s) for s in self._steps]
        carry_memory(steps)
        return {
            "format": TRACE_FORMAT,
            "version": TRACE_VERSION,
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

    def model(self):
        """The units and their parameters, ``{"format": "fsdplab.model", "version": 1, "units":
        [...]}`` (units as in a trace): what ``fsdplab import-kineto --model-json`` reads when the
        profiler did not record shapes. Needs no recorded step."""
        return {"format": "fsdplab.model", "version": 1, "units": unit_entries(self._units)}

    def save_model(self, path):
        """Writes model() to `path`, whole or not at all; returns `path`."""
        return write_atomic(os.fspath(path), json.dumps(self.model(), indent=1) + "\n")

    def save(self, path):
        """Writes the trace whole or not at all; returns the path written (see rank_path)."""
        trace = self.trace()
        out = rank_path(path, trace["meta"]["rank"], trace["meta"]["world_size"])
        return write_atomic(out, dumps(trace))

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
        now = {id(m) for m in self._model.modules() if is_fsdp2_module(m)}
        if now == self._fsdp_modules:
            return
        if self._steps:
            raise RuntimeError(
                "fsdplab.torch: the model's FSDP2 modules changed (fully_shard after steps were "
                "recorded); create a new Recorder after fully_shard"
            )
        before = self.detected_by
        self._detect()
        warnings.warn(
            f"fsdplab.torch: fully_shard was applied after the Recorder was created; units "
            f"detected again ({before} -> {self.detected_by}: {len(self._units)} units). Create "
            "the Recorder after fully_shard.",
            stacklevel=3,
        )
