"""fsdplab from Python: the commands' work as functions that take and return dicts.

    import fsdplab
    report = fsdplab.simulate("traces/gpt_small.json", policy={"forward_prefetch": 2})
    print(report["summary"]["step_time_us"])

Each function runs the same library code as its command (`fsdplab simulate` ...) in this
process: the results are the commands' JSON as Python objects, the errors their messages.
Names are the policy keys (policy={"forward_prefetch": 2} is --forward-prefetch 2), the cluster
file's keys (cluster={"world_size": 64}) and, as keywords, the engine options
(memory_cap="2G" is --memory-cap 2G). A trace is a path (file or directory of per-rank traces),
a dict such as fsdplab.torch.Recorder.trace() returns, or a list of either (one per rank).

Errors: fsdplab.UsageError (the command's exit 1), fsdplab.InvalidInput (exit 2),
fsdplab.StepFailed (exit 3; .result holds the report or table the command still writes), all
fsdplab.Error. The recorder and the policy applier are fsdplab.torch (needs torch, not the
compiled extension: from a source tree, PYTHONPATH=python is enough for it).
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .errors import Error, InvalidInput, StepFailed, UsageError

# The compiled extension (`pip install .` builds it). A source tree's python/ folder has none:
# fsdplab.torch works there, and every function here raises the error of _extension().
try:
    from . import _fsdplab
except ImportError as _missing:
    _fsdplab = None
    _EXTENSION_ERROR: Optional[ImportError] = _missing
else:
    _EXTENSION_ERROR = None

__all__ = [
    "Error", "UsageError", "InvalidInput", "StepFailed",
    "simulate", "sweep", "tune", "cost", "calibrate", "validate", "import_kineto",
    "export_policy", "synth", "ENGINE_OPTIONS",
]

PathLike = Union[str, "os.PathLike[str]"]
TraceLike = Union[PathLike, Mapping[str, Any]]
DocLike = Union[PathLike, Mapping[str, Any]]

# The keywords simulate(), sweep() and tune() take beside policy and cluster (the engine option
# table of sim/sim_options.h: memory_cap is --memory-cap); read from the extension on first use
# (module __getattr__, so that `import fsdplab` works without it).
ENGINE_OPTIONS: Tuple[str, ...]
_ENGINE_OPTIONS: Optional[Tuple[str, ...]] = None


def _extension() -> Any:
    """The compiled module fsdplab._fsdplab, or an ImportError that says how to get it."""
    if _fsdplab is None:
        raise ImportError(
            "fsdplab: the compiled extension fsdplab._fsdplab could not be imported from "
            f"{os.path.dirname(os.path.abspath(__file__))} (the cause is below): install the "
            "package with `pip install .` from the source tree; only fsdplab.torch, the recorder "
            "and the applier, works without it"
        ) from _EXTENSION_ERROR
    return _fsdplab


def _engine_options() -> Tuple[str, ...]:
    global _ENGINE_OPTIONS
    if _ENGINE_OPTIONS is None:
        _ENGINE_OPTIONS = tuple(_extension().engine_option_keys())
    return _ENGINE_OPTIONS


def __getattr__(name: str) -> Any:
    if name == "ENGINE_OPTIONS":
        return _engine_options()
    raise AttributeError(f"module 'fsdplab' has no attribute {name!r}")
_Doc = Union[str, Dict[str, Any]]  # what the bindings take: a path, or a dict


def _source(doc: DocLike) -> _Doc:
    """A document for the bindings: a path (str), or a dict the bindings write as JSON (a
    value JSON cannot hold, such as a NaN, is InvalidInput naming where it is)."""
    if isinstance(doc, (str, dict)):
        return doc
    if isinstance(doc, os.PathLike):
        return os.fspath(doc)
    if isinstance(doc, Mapping):
        return dict(doc)
    raise TypeError(f"expected a path or a dict, got {type(doc).__name__}")


def _optional_source(doc: Optional[DocLike]) -> Optional[_Doc]:
    return None if doc is None else _source(doc)


def _trace_sources(trace: Union[TraceLike, Sequence[TraceLike]]) -> List[_Doc]:
    if isinstance(trace, (list, tuple)):
        return [_source(t) for t in trace]
    return [_source(trace)]


def _text(value: Any) -> str:
    """A value as the command line writes it: True -> "true", 2 -> "2", [a, b] -> "a,b"."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(_text(v) for v in value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _settings(options: Mapping[str, Any]) -> List[Tuple[str, str]]:
    """Keyword options as (key, text) settings; a list for a repeated one (straggler)."""
    out: List[Tuple[str, str]] = []
    for key, value in options.items():
        if value is None:
            continue
        if key == "straggler" and isinstance(value, (list, tuple)):
            out.extend((key, _text(v)) for v in value)
        else:
            out.append((key, _text(value)))
    return out


def _engine_settings(function: str, options: Mapping[str, Any]) -> List[Tuple[str, str]]:
    known = _engine_options()
    unknown = sorted(options.keys() - set(known))
    if unknown:
        raise TypeError(f"{function}() got unexpected keyword argument(s) {', '.join(unknown)} "
                        f"(engine options: {', '.join(known)})")
    return _settings(options)


def _result(outcome: Tuple[int, str, Any]) -> Any:
    """The bindings' (exit code, message, result): the result (a dict, list or str, made in C++
    from the command's document), or the exception of the exit code."""
    code, message, value = outcome
    if code == 0:
        return value
    if code == 1:
        raise UsageError(message)
    if code == 2:
        raise InvalidInput(message)
    if code == 3:
        raise StepFailed(message, value)
    raise Error(message)


def simulate(trace: Union[TraceLike, Sequence[TraceLike]], policy: Optional[DocLike] = None,
             cluster: Optional[DocLike] = None, *, preset: Optional[str] = None,
             explain: bool = False, prune_ranks: bool = False, band: bool = False,
             **options: Any) -> Dict[str, Any]:
    """`fsdplab simulate TRACE --json`: the fsdplab.report v1 object.

    policy: a policy file or dict (its keys as --policy FILE reads them); preset: fsdp2,
    megatron-fsdp or deepspeed-zero3, under the policy; cluster: a cluster file or dict;
    explain, prune_ranks, band: --explain, --prune-ranks, --band; **options: the engine
    options (ENGINE_OPTIONS), e.g. steps=4, memory_cap="2G", straggler=["3:1.5"].
    Raises StepFailed (with .result, the report) when the simulated step fails.
    """
    return _result(_extension().simulate(
        _trace_sources(trace), preset, _optional_source(policy), _optional_source(cluster),
        _engine_settings("simulate", options), explain, prune_ranks, band))


def sweep(trace: TraceLike, grid: Mapping[str, Any], policy: Optional[DocLike] = None,
          cluster: Optional[DocLike] = None, *, preset: Optional[str] = None,
          cap_peak: Optional[str] = None, jobs: int = 0, **options: Any) -> Dict[str, Any]:
    """`fsdplab sweep TRACE -o FILE.json`: every combination of `grid`'s values simulated.

    grid: policy key -> a list of values (or one value), e.g.
    {"forward_prefetch": [0, 1, 2], "order": ["registration", "recorded"]}; a unit list's
    alternatives are lists of unit names. With memory_cap the row chosen is the fastest under
    the cap; StepFailed (with .result, the table) when none fits.
    """
    axes: List[Tuple[str, List[str]]] = []
    for key, values in grid.items():
        if not isinstance(values, (list, tuple)):
            values = [values]
        axes.append((key, [_text(v) for v in values]))
    return _result(_extension().sweep(
        _source(trace), preset, _optional_source(policy), axes, _optional_source(cluster),
        _engine_settings("sweep", options), cap_peak, jobs))


def tune(trace: Union[TraceLike, Sequence[TraceLike]], memory_cap: Union[int, str],
         policy: Optional[DocLike] = None, cluster: Optional[DocLike] = None, *,
         preset: Optional[str] = None, to: Optional[str] = None, cap_peak: Optional[str] = None,
         objective: Optional[str] = None, budget_kinds: Optional[Sequence[str]] = None,
         time_limit_s: Optional[float] = None, exact_max: Optional[int] = None,
         **options: Any) -> Dict[str, Any]:
    """`fsdplab tune TRACE --memory-cap B --json`: the fastest per-unit policy under the cap.

    Starts from the policy that policy and preset give; `to` keeps the search to what a
    framework can express ("fsdp2", "megatron-fsdp", "any"). Returns the command's JSON:
    {"best": {"policy", "step_time_us", ...}, "global_best": {...}, "why": [...], ...};
    StepFailed (with .result) when no policy fits.
    """
    settings = _engine_settings("tune", options) + [("memory_cap", _text(memory_cap))]
    kinds = None if budget_kinds is None else ",".join(budget_kinds)
    return _result(_extension().tune(
        _trace_sources(trace), preset, _optional_source(policy), _optional_source(cluster),
        settings, cap_peak, objective, kinds, time_limit_s, exact_max, to))


def cost(cluster: DocLike, collective: str, sizes: Sequence[Union[int, str]],
         world_size: Optional[int] = None) -> Dict[str, Any]:
    """`fsdplab cost --json`: a collective's time at each size under a cluster file or dict."""
    return _result(_extension().cost(_source(cluster), collective, [_text(s) for s in sizes],
                                 world_size))


def calibrate(files: Sequence[PathLike], *, ranks: Optional[int] = None,
              collective: Optional[str] = None, block: Optional[int] = None,
              tier: Optional[str] = None, in_place: bool = False, compute_scale: float = 1.0,
              gpus_per_node: Optional[int] = None,
              contention: Optional[PathLike] = None) -> Dict[str, Any]:
    """`fsdplab calibrate FILES --json`: {"fits", "notes", "cluster"} (the cluster file)."""
    return _result(_extension().calibrate(
        [os.fspath(f) for f in files], ranks, collective, block, tier, in_place, compute_scale,
        gpus_per_node, None if contention is None else os.fspath(contention)))


def validate(trace: TraceLike) -> List[str]:
    """`fsdplab validate`: every problem of a trace file or dict; empty when it is valid."""
    return _result(_extension().validate(_source(trace)))


def import_kineto(profiles: Union[PathLike, Sequence[PathLike]], *, step: Optional[int] = None,
                  rank: Optional[int] = None,
                  model_json: Optional[PathLike] = None) -> List[Dict[str, Any]]:
    """`fsdplab import-kineto`: PyTorch profiler traces of an FSDP2 run as traces, by rank."""
    if isinstance(profiles, (str, os.PathLike)):
        profiles = [profiles]
    return _result(_extension().import_kineto(
        [os.fspath(p) for p in profiles], step, rank,
        None if model_json is None else os.fspath(model_json)))


def export_policy(policy: DocLike, trace: TraceLike, to: str = "fsdp2",
                  format: str = "json") -> Union[Dict[str, Any], str]:
    """`fsdplab export-policy`: the policy for a framework (fsdp2 or megatron-fsdp); a dict
    (format="json", what fsdplab.torch.apply_policy reads) or a Python script (format="python").
    """
    applier = ""
    if format == "python":
        applier = _applier_source()
    outcome = _extension().export_policy(_source(policy), _source(trace), to, format, applier)
    return _result(outcome)


def _applier_source() -> str:
    """The applier's source text, python/fsdplab/torch/apply.py (what export_policy(format=
    "python") and `fsdplab export-policy --format python` write into their scripts); read as a
    file, so that torch is not imported."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch", "apply.py")
    with open(path, encoding="utf-8") as f:
        return f.read()


def synth(**config: Any) -> Dict[str, Any]:
    """`fsdplab synth`: the trace of a GPT/Llama-like model; keywords as its flags
    (layers=4, hidden=1024, kv_heads=8, tie_embeddings=True, ...)."""
    return _result(_extension().synth(_settings(config)))
