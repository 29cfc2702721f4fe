"""FSDP2 (fully_shard) while a step is recorded: FSDP's own methods are bracketed so that their
time is excluded from every unit's compute, the all-gathers and reduce-scatters they issue are
written as measured collective events, the rest of FSDP's work (copies, casts) as computes
without a unit, and the backward's end waits for FSDP's final callback. FSDP's objects are found
by attribute: nothing of torch.distributed.fsdp is imported."""


import torch

from .hooks import Frame


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


_ABSENT = object()


def fsdp2_configuration(units):
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
        keeps = {getattr(g, "post_forward_mesh_info", _ABSENT) is None for g in groups}
        has_info = all(hasattr(g, "post_forward_mesh_info") for g in groups)
        if groups and has_info and len(keeps) == 1:
            recorded[name] = {"reshard_after_forward": not keeps.pop()}
        for phase in ("forward", "backward"):
            targets = getattr(state, f"_states_to_{phase}_prefetch", None) or []
            named = [unit_of_state.get(id(t)) for t in targets]
            if named:
                lists.setdefault(name, {})[phase] = [n for n in named if n is not None]
    return ({"units": recorded} if recorded else None), (lists or None)


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
# The state's forward hooks, registered on its module(s) once by fully_shard (the bound method is
# kept in the module's hook dict, so the entry there is bracketed): all of their Python (the
# dynamo guard, the state's checks, the pre-backward hooks on the outputs), not only the
# parameter groups' methods inside, is FSDP's own work.
_FSDP_STATE_HOOKS = (
    ("_pre_forward", "_pre_forward_hook_handle"),
    ("_post_forward", "_post_forward_hook_handle"),
)
# The FSDP methods that may run before anything of a microbatch was recorded (the root's forward
# prologue, an explicit prefetch); the others, outside a microbatch, ran after its backward_end.
_FSDP_OPENS_PASS = frozenset(
    ("_pre_forward", "_root_pre_forward", "pre_forward", "unshard", "wait_for_unshard")
)


def _hook_entries(handle):
    """The (hook dict, key) pairs a hook handle removes: a RemovableHandle's one, or each of a
    handle over several (FSDP2's grouped modules)."""
    inner = getattr(handle, "handles", None)
    if inner is not None:
        return [entry for h in inner for entry in _hook_entries(h)]
    ref = getattr(handle, "hooks_dict_ref", None)
    hooks = ref() if callable(ref) else None
    key = getattr(handle, "id", None)
    return [(hooks, key)] if isinstance(hooks, dict) and key in hooks else []


def _all_gather_bytes(result, u):
    """The bytes an all-gather produces (FSDP's padded output), else the unit's parameters."""
    out = getattr(result, "all_gather_output", None)
    if isinstance(out, torch.Tensor):
        return int(out.numel() * out.element_size())
    return u.param_bytes


class Fsdp2Mixin:
    """The Recorder's FSDP2 brackets: patches the units' FSDP states and parameter groups
    (self._fsdp_patches) when a step opens; emits into the step's event stream (self._events,
    self._stack, self._mark) and counts its time in self._fsdp_ns."""

    def _patch_fsdp(self):
        seen = set()
        for u in self._units:
            state, groups = _fsdp_state_and_groups(u.module)
            if state is None or id(state) in seen:
                continue
            seen.add(id(state))
            self._fsdp_states.append(state)
            for name in _FSDP_STATE_METHODS:
                self._fsdp_patches.replace(state, name, self._bracket(u, name, None))
            for name, handle in _FSDP_STATE_HOOKS:
                for hooks, key in _hook_entries(getattr(state, handle, None)):
                    self._fsdp_patches.replace_entry(hooks, key, self._bracket(u, name, None))
            for g in groups:
                for name in _FSDP_GROUP_METHODS:
                    self._fsdp_patches.replace(g, name, self._bracket(u, name, g))
            if groups:
                # FSDP2 runs the unit's post-backward once the gradients of its inputs are all
                # computed: its backward ends there (_fsdp_enter), not at its last parameter's
                # gradient, after which its inputs' gradients may still be computed.
                self._fsdp_post_backward.add(u.index)

    def _bracket(self, u, name, group):
        """make_wrapper for InstancePatches: FSDP's method `name` of unit u bracketed."""

        def make_wrapper(original):
            def wrapper(*args, **kwargs):
                if not self._active:
                    return original(*args, **kwargs)
                token = self._fsdp_enter(u, name, group)
                try:
                    return original(*args, **kwargs)
                finally:
                    self._fsdp_exit(token)

            return wrapper

        return make_wrapper

    def _unpatch_fsdp(self):
        self._fsdp_patches.restore()

    def _fsdp_enter(self, u, name, group):
        if self._events is None and name not in _FSDP_OPENS_PASS:
            return None  # after backward_end (nothing of a microbatch is open): not recorded
        t0 = self._hook_enter()
        m = self._mark()
        if name == "post_backward" and u.bw_frame is not None and self._in_backward:
            self._post_backward(u, m)
        if self._probe is not None:
            self._probe.foreign += 1
        frame = Frame(None, "fsdp")
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
        self._hook_leave(t0)
        return token

    def _fsdp_exit(self, token):
        if token is None or not self._active:
            return
        t1 = self._hook_enter()
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
                    # Synchronous (a CPU run): its copy-out is FSDP's next wait_for_unshard.
                    gather = self._emit_collective("all_gather", u, nbytes, start, m)
                    self._copy_out_due[id(group)] = gather
                else:  # asynchronous: it ends when FSDP has waited for it
                    self._pending_gathers[id(group)] = (u, nbytes, start)
        elif name == "wait_for_unshard":
            pending = self._pending_gathers.pop(id(group), None)
            gather = self._copy_out_due.pop(id(group), None)
            if pending is not None:
                self._emit_collective("all_gather", pending[0], pending[1], pending[2], m)
            elif gather is not None:
                # The copy into the parameters and their swap, after a synchronous gather: the
                # gather's copy-out (a policy that drops the gather drops it), not FSDP's work.
                gather[5] = (start, m)
                self._fsdp_collectives.append((start, m))
        elif name == "post_backward" and self._world_size > 1 and u.param_bytes:
            if not before.endswith("POST_BACKWARD") and u.index not in self._reduced:
                self._reduced.add(u.index)
                self._emit_collective("reduce_scatter", u, u.param_bytes, start, m)
        self._fsdp_depth -= 1
        if self._fsdp_depth == 0:  # FSDP's methods nest (pre_forward calls unshard): once
            self._fsdp_ns += t1 - t0
            self._emit_fsdp_work(start, m)
        self._hook_calls += 1
        self._hook_leave(t1)

    def _emit_collective(self, kind, u, nbytes, start, end):
        """Appends a measured collective; returns its record [kind, unit, bytes, start mark, end
        mark, copy-out (start, end) marks or None]."""
        record = [kind, u, nbytes, start, end, None]
        self._events.append(("collective", record, end))
        if self._fsdp_depth > 0:
            self._fsdp_collectives.append((start, end))
        return record

    def _emit_fsdp_work(self, start, end):
        """FSDP's own work outside its collectives and their copy-outs (casts, the reshard, the
        hooks' Python) keeps the compute stream busy too: one compute without a unit for the
        outermost bracket less the collectives and copy-outs inside it (a segment given backwards
        subtracts). Traces have no event labels yet (the reader rejects "name"), so it
        reads like the loss: work outside every unit."""
        if not self._fsdp_work:
            return
        frame = Frame(None, "backward" if self._in_backward else "forward", name="fsdp")
        frame.segments.append((start, end))
        frame.segments.extend((b, a) for a, b in self._fsdp_collectives if a >= start)
        self._events.append(("compute", frame, start))

    def _fsdp_final_callback_pending(self):
        for state in self._fsdp_states:
            ctx = getattr(state, "_state_ctx", None)
            if getattr(ctx, "post_backward_final_callback_queued", False):
                return True
        return False
