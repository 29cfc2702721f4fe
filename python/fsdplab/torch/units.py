"""Which modules of a model are units, and what each unit holds: detection (names, a predicate,
FSDP2's and Megatron-FSDP's modules by class name, else the first ModuleList's children), the
units' tree and parameters, and the trace dtype of a parameter. Imports torch only."""

import torch

_DTYPES = {
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
}
DTYPE_NAMES = ("fp32", "bf16", "fp16", "mxfp8")


def type_names(obj):
    return {cls.__name__ for cls in type(obj).__mro__}


def trace_dtype(tensor):
    """The trace dtype of a parameter: fp32, bf16, fp16, or mxfp8 for Transformer Engine MXFP8
    tensors (recognised by class name, also as the local tensor of a DTensor). None if the dtype
    has no trace spelling."""
    for t in (tensor, getattr(tensor, "_local_tensor", None)):
        if t is not None and any("MXFP8" in name for name in type_names(t)):
            return "mxfp8"
    return _DTYPES.get(tensor.dtype)


def is_fsdp2_module(module):
    return "FSDPModule" in type_names(module)


def _megatron_fsdp_wrappers(model):
    return [
        m
        for m in model.modules()
        if "MegatronFSDP" in type_names(m) and hasattr(m, "fsdp_unit_modules")
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
                    f"fsdplab.torch: units={unknown!r}: no such module in the model "
                    f"(module names look like {next((n for n in known if n), '(none)')!r})"
                )
            picked = set(wanted)
            how = "names"
    elif any(is_fsdp2_module(m) for _, m in named):
        picked = {name for name, m in named if is_fsdp2_module(m)}
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


class Unit:
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


def build_units(model, qualnames, root_name, param_dtype):
    """The units of `model` named by `qualnames` (detect_units), with their parents and
    parameters (a shared parameter belongs to its first owner): (units, leaf_owner), leaf_owner
    mapping id(module) -> Unit for the modules that hold a unit's parameters but are not units."""
    by_qualname = {}
    units = []
    for i, q in enumerate(qualnames):
        module = model.get_submodule(q) if q else model
        u = Unit(i, f"{root_name}.{q}" if q else root_name, q, module)
        units.append(u)
        by_qualname[q] = u
    leaf_owner = {}  # id(module) -> Unit, for modules that hold a unit's parameters
    unit_of_module = {id(u.module): u for u in units}
    owner_of = {}  # qualname -> owning unit
    seen_params = set()
    for q, module in model.named_modules():
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
        if direct and id(module) not in unit_of_module:
            leaf_owner[id(module)] = owner
        for attr, p in direct:
            if id(p) in seen_params:
                continue  # a shared parameter belongs to its first owner
            seen_params.add(id(p))
            rel = q[len(owner.qualname) :].lstrip(".") if owner.qualname else q
            dtype = param_dtype or trace_dtype(p)
            if dtype is None:
                raise ValueError(
                    f"fsdplab.torch: parameter '{owner.name}:{rel + '.' if rel else ''}"
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
    return units, leaf_owner


def encloses(outer, u):
    """Whether unit `outer` is one of u's ancestors."""
    p = u.parent
    while p is not None:
        if p is outer:
            return True
        p = p.parent
    return False
