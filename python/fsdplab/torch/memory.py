"""Memory steps: a dispatch mode counts every storage an operator creates until it is freed
(the probe, read at each mark), each compute gets what it did to the memory beyond the
parameters, gradients and FSDP's buffers, and a step recorded without the probe takes the memory
of an earlier probed step that ran alike."""

import weakref

import torch


def tensors_in(obj, out):
    """Appends the tensors inside a (nested) tuple / list / dict output to `out`."""
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            tensors_in(x, out)
    elif isinstance(obj, dict):
        for x in obj.values():
            tensors_in(x, out)
    return out


def dispatch_mode_class():
    """torch's TorchDispatchMode where storages can be followed (torch >= 2.0), or None."""
    if not hasattr(torch.Tensor, "untyped_storage"):
        return None
    try:
        from torch.utils._python_dispatch import TorchDispatchMode
    except ImportError:
        return None
    return TorchDispatchMode


def storage(t):
    """The untyped storage of a plain tensor, or None (no storage, or a tensor subclass)."""
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError, AttributeError):
        return None


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def make_memory_probe():
    """The memory probe of a memory step: a dispatch mode that adds the bytes of every storage an
    operator creates and takes them off when the storage is freed (a weak reference's callback),
    so that each mark can read what is allocated now and the most that was since the last mark,
    and which storages were allocated before that peak (allocation sequence numbers).
    Tensor subclasses (DTensor) are left to unwrap into the operators it counts, as
    FSDPMemTracker does. None when torch has no dispatch modes."""
    base = dispatch_mode_class()
    if base is None:
        return None

    class _MemoryProbe(base):
        def __init__(self):
            super().__init__()
            self.live = 0
            self.peak = 0
            # Allocations are numbered; those numbered below peak_seq were there before the
            # peak since the last read (the one that made the peak is not: it is being made).
            self.seq = 0
            self.peak_seq = 1
            self._held = {}  # id(storage) -> (weak reference, bytes, sequence number)
            # id(storage) -> the sequence number when autograd handed it over as a parameter's
            # .grad (after that allocation, before the next), where torch tells (2.1 on).
            self.handed = {}
            # > 0 while FSDP's own methods run: what they create (gather buffers, gradient
            # copies) is the plan's, so it is neither counted nor its free taken off later.
            self.foreign = 0
            self._foreign = {}  # id(storage) -> weak reference

        def read(self):
            """(bytes allocated now, the most allocated since the last read, the sequence
            number below which allocations were there at that peak)."""
            peak, self.peak = self.peak, self.live
            peak_seq, self.peak_seq = self.peak_seq, self.seq + 1
            return self.live, peak, peak_seq

        def before_peak(self, st, peak_seq, hooked):
            """Whether a parameter's gradient storage was a gradient at the peak numbered
            peak_seq: handed over before that allocation. `hooked`: hand-overs are noted, and
            one not noted yet is happening now (the recorder's own hook on that parameter ran
            first); otherwise, allocated before it. A storage the probe did not count (made by
            FSDP's own code): yes."""
            handed = self.handed.get(id(st), self.seq if hooked else None)
            if handed is not None:
                return handed < peak_seq
            entry = self._held.get(id(st))
            if entry is None or entry[0]() is not st:
                return True
            return entry[2] < peak_seq

        def _freed(self, key):
            entry = self._held.pop(key, None)
            if entry is not None:
                self.live -= entry[1]

        def _count(self, t):
            st = storage(t)
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
            self.seq += 1
            self._held[key] = (weakref.ref(st, lambda _, k=key: self._freed(k)), n, self.seq)
            self.live += n
            if self.live > self.peak:
                self.peak = self.live
                self.peak_seq = self.seq

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            subclasses = [t for t in types if t not in _PLAIN]
            if subclasses:
                if all(hasattr(t, "__tensor_flatten__") for t in subclasses):
                    # A wrapper (DTensor): it unwraps into plain operators, which come back here.
                    return NotImplemented
                # Anything else (the FakeTensors of DTensor's sharding propagation, e.g. when an
                # optimizer creates its state in a memory step) allocates nothing real: run it
                # as it is, uncounted (declining it would leave the operator with no handler).
                return func(*args, **(kwargs or {}))
            out = func(*args, **(kwargs or {}))
            # An output on an input's storage (a view, an in-place or out= result) allocated
            # nothing: a parameter's transpose is not new memory.
            inputs = tensors_in(kwargs, tensors_in(args, [])) if kwargs else tensors_in(args, [])
            reused = {st.data_ptr() for st in map(storage, (x for x in inputs if type(x) in _PLAIN))
                      if st is not None}
            for t in tensors_in(out, []):
                if type(t) not in _PLAIN:  # a factory's FakeTensor under sharding propagation
                    continue
                st = storage(t)
                if st is not None and st.data_ptr() not in reused:
                    self._count(t)
            return out

    return _MemoryProbe()


class MemoryMixin:
    """The Recorder's memory measurement in memory steps: reads self._probe (None outside a
    memory step) and self._mem (the probe's reading at each mark); sets frame.grads0 and
    frame.memory."""

    @staticmethod
    def _grads_of(u):
        """{id(storage): storage} of the gradients the unit's parameters hold now (FSDP2: the
        unsharded parameters' while the unit is unsharded)."""
        grads = {}
        for module, attr in u.param_slots:
            p = module._parameters.get(attr)
            g = getattr(p, "grad", None) if p is not None else None
            st = storage(g) if g is not None else None
            if st is not None:
                grads[id(st)] = st
        return grads

    def _open_memory(self, frame):
        """A unit's backward frame opens in a memory step: the gradients already there, and a
        hook on each of its parameters that notes when autograd hands a gradient over."""
        if self._probe is not None and frame.unit is not None:
            frame.grads0 = self._grads_of(frame.unit)
            self._hook_handover(frame.unit)

    def _hook_handover(self, u):
        """Post-accumulate-grad hooks (torch 2.1 on) on the unit's parameters as they are now,
        once per parameter object, removed with the step's hooks (self._handles). Called where
        they are autograd's leaves: as its forward ends (FSDP2: the unsharded parameters,
        before FSDP reshards them) and as its backward opens. self._handover_hooked is None
        where torch has no such hook."""
        if self._handover_hooked is None:
            return
        for module, attr in u.param_slots:
            p = module._parameters.get(attr)
            if p is None or not p.requires_grad or id(p) in self._handover_hooked:
                continue
            self._handover_hooked.add(id(p))
            self._handles.append(p.register_post_accumulate_grad_hook(self._handed_over))

    def _handed_over(self, p):
        probe = self._probe
        st = storage(p.grad) if probe is not None and p.grad is not None else None
        if st is not None:
            probe.handed[id(st)] = probe.seq

    def _measure_memory(self, frame):
        """The compute's own memory curve over its segments (what ran between them, children,
        FSDP's brackets, is not its own): how far it rose above its start (peak) and where it
        ended (net); less, for a backward, the unit's gradients it produced, which the plan
        holds as gradients, and of those the ones made before the peak (the gradient an
        operator is making at the peak is not handed over yet). The net is what it keeps (saved)
        or releases."""
        mem = self._mem
        base = 0
        top = 0
        top_seq = None  # allocations numbered below it were there at the peak
        for a, b in frame.segments:
            if b <= a or b >= len(mem):
                continue
            start = mem[a][0]
            live, peak, peak_seq = mem[b]
            if top_seq is None or base + peak - start > top:
                top, top_seq = base + peak - start, peak_seq
            base += live - start
        grads = at_peak = None
        if frame.grads0 is not None:
            new = [st for k, st in self._grads_of(frame.unit).items() if k not in frame.grads0]
            grads = sum(int(st.nbytes()) for st in new)
            hooked = self._handover_hooked is not None
            at_peak = sum(int(st.nbytes()) for st in new
                          if top_seq is None or self._probe.before_peak(st, top_seq, hooked))
        net = base - (grads or 0)
        frame.memory = (max(net, 0), max(-net, 0), max(top, 0), grads, at_peak)


_MEMORY_KEYS = ("saved_bytes", "released_bytes", "peak_bytes", "grad_bytes", "peak_grad_bytes")


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


def carry_memory(steps):
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
