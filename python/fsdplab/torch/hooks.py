"""The hook state machine: the hooks registered while a step is recorded and what each does to
the step's state. Marks on the clock split time into segments that belong to the innermost open
frame (a unit's forward, backward or recomputation, the work outside every unit, or FSDP's own
work); frames become compute events, hooks become pre_forward / post_forward / pre_backward /
post_backward / backward_end events, per microbatch."""

import contextlib
import inspect
import time
import weakref

import torch

from .clock import CpuClock, CudaClock
from .memory import make_memory_probe, tensors_in
from .units import encloses
from .writer import world_and_rank

_MISSING = object()
NO_INPUT_GRAD_WARNING = "Full backward hook is firing when gradients are computed with respect"


def has_post_accumulate_grad_hook():
    return hasattr(torch.Tensor, "register_post_accumulate_grad_hook")


def has_hook_kwarg(name):
    """Whether register_forward_hook takes `name` (torch >= 2.0: prepend; >= 2.1: always_call)."""
    try:
        return name in inspect.signature(torch.nn.Module.register_forward_hook).parameters
    except (TypeError, ValueError):
        return False


def has_always_call():
    """Whether forward hooks can run when the forward raises (torch >= 2.1): what closes a
    recomputation that a non-reentrant checkpoint stops early."""
    return has_hook_kwarg("always_call")


class InstancePatches:
    """Methods replaced on objects' instance dicts while a step is recorded (FSDP's, the
    optimizer's), and hooks replaced in the dicts a module keeps them in (FSDP's forward hooks),
    and put back as they were."""

    def __init__(self):
        self._previous = []  # (dict, key, previous value or _MISSING)

    def replace(self, obj, name, make_wrapper):
        """obj.name becomes make_wrapper(the method); nothing when obj has no such method."""
        original = getattr(obj, name, None)
        if original is None or not callable(original):
            return
        self._replace(obj.__dict__, name, make_wrapper(original))

    def replace_entry(self, mapping, key, make_wrapper):
        """mapping[key] (a registered hook) becomes make_wrapper(the hook)."""
        original = mapping.get(key)
        if original is not None and callable(original):
            self._replace(mapping, key, make_wrapper(original))

    def _replace(self, mapping, key, wrapper):
        self._previous.append((mapping, key, mapping.get(key, _MISSING)))
        mapping[key] = wrapper

    def restore(self):
        for mapping, key, previous in reversed(self._previous):
            if previous is _MISSING:
                mapping.pop(key, None)
            else:
                mapping[key] = previous
        self._previous.clear()


class Frame:
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
        self.unit = unit  # Unit, or None for work outside every unit (the loss) or FSDP's
        self.phase = phase
        self.segments = []  # (mark, mark) pairs
        self.saved = 0
        self.tensors = [] if phase == "forward" or phase == "recompute" else None
        self.leaf = leaf  # the module of an inside recomputation running now
        self.inside = inside
        self.name = name  # the event's label ("fsdp": FSDP's own work outside collectives)
        self.grads0 = None  # memory steps, backward: the unit's gradients when the frame opened
        # memory steps: (saved, released, peak, grad bytes, of those held at the peak)
        self.memory = None


class HookStateMachine:
    """The Recorder's hooks and step state. Registers the units' hooks when a step opens (and the
    FSDP2 and optimizer patches of the other mixins), keeps the open frames (self._stack) and
    the microbatches' raw events, and removes everything when the step closes."""

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
        if self._handover_hooked is not None:
            self._handover_hooked.clear()
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
            self._patch_recompute_start()

    def _remove_leaf_hooks(self):
        for h in self._leaf_handles:
            h.remove()
        self._leaf_handles = []
        if self._recompute_patch is not None:
            cls, original = self._recompute_patch
            cls.get_inputs = original
            self._recompute_patch = None

    def _patch_recompute_start(self):
        """A non-reentrant checkpoint's recomputation begins when the backward first unpacks one
        of its saved tensors: its unpack hook reads the checkpoint's inputs back
        (_CheckpointFrame.get_inputs, torch >= 2.1) before it runs the modules again. The time
        from there to the first recomputed module (the hook's own work, the recomputation's
        contexts) is the recomputation's, as the profiler import counts it: marked here, given
        to the inside recomputation that opens next (_leaf_pre)."""
        from torch.utils import checkpoint

        cls = getattr(checkpoint, "_CheckpointFrame", None)
        original = getattr(cls, "get_inputs", None) if cls is not None else None
        if original is None or self._recompute_patch is not None:
            return

        def get_inputs(frame):
            if self._active and self._in_backward and self._last_mark is not None:
                self._mark()
                self._recompute_start = self._last_mark
            return original(frame)

        cls.get_inputs = get_inputs
        self._recompute_patch = (cls, original)

    # ----------------------------------------------------------------------------------------
    # Step state

    def _begin_step(self):
        self._clock = CudaClock() if self._timing == "cuda" else CpuClock()
        self._hook_depth = 0  # recorder hooks open now (_hook_enter)
        self._microbatches = []  # lists of raw events
        self._events = None  # raw events of the open microbatch
        self._stack = []  # open frames, innermost last
        self._gap = None  # frame for work outside every unit before the backward
        self._in_backward = False
        self._last_mark = None
        self._pending_gathers = {}  # id(FSDP param group) -> (unit, bytes, start mark)
        self._copy_out_due = {}  # id(FSDP param group) -> its synchronous gather's record
        self._reduced = set()  # units whose reduce-scatter this backward has recorded
        self._fsdp_states = []
        self._fsdp_post_backward = set()  # units whose backward FSDP2's post-backward ends
        self._recompute_start = None  # the mark where a checkpoint's recomputation began
        self._fsdp_depth = 0  # FSDP methods open now (they nest)
        self._fsdp_collectives = []
        self._end_requeued = 0
        self._optimizer_spans = []  # (start, end) marks of optimizer.step() and zero_grad()
        self._world_size = world_and_rank()[0]
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
        self._probe = make_memory_probe() if len(self._steps) < self._memory_steps else None
        self._reset_microbatch()
        self._register_hooks()
        self._active = True

    def _hook_enter(self):
        """The recorder's own work begins (a hook, FSDP's bracket bookkeeping): its time is
        counted (overhead()) and, on the CPU clock, left out of the step's marks. Hooks that run
        inside one (a compute measured as a hook closes it) belong to the outer one."""
        t0 = time.perf_counter_ns()
        self._hook_depth += 1
        if self._hook_depth == 1 and self._clock is not None:
            self._clock.hook_start = t0
        return t0

    def _hook_leave(self, t0):
        self._hook_depth -= 1
        if self._hook_depth > 0:
            return
        spent = time.perf_counter_ns() - t0
        self._hook_ns += spent
        if self._clock is not None:
            self._clock.hidden_ns += spent
            self._clock.hook_start = None

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
                    self._gap = Frame(None, "forward")
                self._gap.segments.append((self._last_mark, m))
        self._last_mark = m
        return m

    def _take_recompute_start(self, frame):
        """A recomputation of frame's unit opens: the time since its checkpoint's unpack hook
        began (_patch_recompute_start), the last segment of the unit's backward, is its own."""
        below = self._stack[-1] if self._stack else None
        start, self._recompute_start = self._recompute_start, None
        if start is None or below is None or below.unit is not frame.unit or not below.segments:
            return
        if below.segments[-1][0] == start:
            frame.segments.append(below.segments.pop())

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
                f"fsdplab.torch: the step ended with units still open ({open_units}): a forward "
                "or backward was interrupted"
            )
        # Read the clock now (CUDA: one synchronize, after the step); build the events on demand.
        if self._optimizer_spans and self._microbatches:
            self._optimizer_seen = True
        return (self._microbatches, self._clock.times_us(), self._optimizer_spans)

    # ----------------------------------------------------------------------------------------
    # Hooks. Each returns None (results are never changed) and returns at once outside a step.

    def _make_pre_forward(self, u):
        def hook(module, inputs):
            if not self._active:
                return
            t0 = self._hook_enter()
            m = self._mark()
            self._split_outer(u)
            frame = Frame(u, "recompute" if self._in_backward else "forward")
            if self._in_backward:
                u.recompute_seen.add("reentrant")
                self._take_recompute_start(frame)
            else:
                u.fw_calls += 1
            self._stack.append(frame)
            u.fw_depth += 1
            self._emit("pre_forward", u, m)
            self._hook_calls += 1
            self._hook_leave(t0)

        return hook

    def _make_post_forward(self, u):
        # Registered with always_call where torch has it: output is None when the forward raised
        # (a non-reentrant checkpoint stopping its recomputation early).
        def hook(module, inputs, output):
            if not self._active:
                return
            t0 = self._hook_enter()
            frame = self._find_forward_frame(u)
            if frame is not None:
                m = self._mark()
                self._close_forward_frame(frame, m)
                if torch.is_grad_enabled() and output is not None:
                    self._hook_output_grads(u, output)
                    if u.trainable and self._lazy_params:
                        self._hook_params(u)
                    if u.trainable and self._probe is not None:
                        self._hook_handover(u)
            self._hook_calls += 1
            self._hook_leave(t0)

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
        tensors = [t for t in tensors_in(output, []) if t.requires_grad]
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
            t0 = self._hook_enter()
            self._post_backward(u, self._mark())
            self._hook_calls += 1
            self._hook_leave(t0)

        return hook

    def _pre_backward(self, u):
        t0 = self._hook_enter()
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
            u.bw_frame = Frame(u, "backward")
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
        self._hook_leave(t0)

    def _split_backward(self, frame):
        """A unit called more than once in forward has that many backward computes: when another
        backward starts over one of its calls' backward, that call's compute ends. Returns
        whether it did."""
        u = frame.unit
        if not frame.segments or u.fw_calls - u.bw_done <= 1:
            return False
        self._emit_compute(frame)
        u.bw_done += 1
        fresh = Frame(u, "backward")
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
        if top.phase not in ("forward", "backward") or not encloses(top.unit, u):
            return
        self._emit_compute(top)
        fresh = Frame(top.unit, top.phase)
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
            t0 = self._hook_enter()
            u.grads_seen.add(key)
            if u.bw_frame is not None and u.remaining > 0:
                u.remaining = self._hook_missing(u) if u.sparse else u.remaining - 1
                if u.remaining == 0:
                    u.last_key = key
                    if u.index not in self._fsdp_post_backward:
                        self._post_backward(u, self._mark())
            self._hook_calls += 1
            self._hook_leave(t0)

        return hook

    def _post_backward(self, u, m):
        self._close_stopped_recomputations(m)
        frame = u.bw_frame
        u.bw_frame = None
        self._stack.remove(frame)
        self._emit_compute(frame)
        u.bw_done += 1
        self._emit("post_backward", u, m)

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
        t0 = self._hook_enter()
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
        self._hook_leave(t0)

    def _leaf_pre(self, module, inputs):
        owner = self._leaf_owner.get(id(module))
        if owner is None or not self._active or not self._in_backward or owner.fw_depth > 0:
            return
        top = self._stack[-1] if self._stack else None
        if top is not None and top.inside and top.unit is owner:
            if top.leaf is not None:
                return  # a nested module of the one running now
            # The next module of the same recomputation: one compute for all of them.
            t0 = self._hook_enter()
            self._mark(settle=False)
            top.leaf = module
        else:
            t0 = self._hook_enter()
            self._mark()
            owner.recompute_seen.add("inside")
            frame = Frame(owner, "recompute", leaf=module, inside=True)
            self._take_recompute_start(frame)
            self._stack.append(frame)
        self._hook_calls += 1
        self._hook_leave(t0)

    def _leaf_post(self, module, inputs, output):
        # Registered with always_call where torch has it (an early-stopped recomputation).
        if not self._active or not self._stack or self._stack[-1].leaf is not module:
            return
        t0 = self._hook_enter()
        self._mark(settle=False)
        self._stack[-1].leaf = None  # open until something else than its next module runs
        self._hook_calls += 1
        self._hook_leave(t0)
