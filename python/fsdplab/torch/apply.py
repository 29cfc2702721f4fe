"""Applies a prefetch policy that `fsdplab export-policy` resolved for a framework to a live model.

    fsdplab export-policy tuned.json --trace trace.json --to fsdp2 --format json -o fsdp2.json

    from fsdplab.torch import apply_policy
    for layer in model.layers: fully_shard(layer)
    fully_shard(model)
    notes = apply_policy(model, "fsdp2.json")   # before the first forward

Modules are found by their fully qualified names (model.named_modules(); the root is ""). A name
the model lacks is an error naming it. FSDP2: each module's set_modules_to_forward_prefetch and
set_modules_to_backward_prefetch lists and set_reshard_after_forward. Megatron-FSDP v2 takes its
per-module element budgets in fully_shard(): pass fully_shard_kwargs(policy, fqn) there.
Needs only the standard library and torch; `fsdplab export-policy --format python` copies this
file into the script it writes.
"""

import json

FORMAT = "fsdplab.framework_policy"


class PolicyError(ValueError):
    """The policy cannot be applied to this model (a missing module, a module FSDP does not
    manage, a file that is not an exported policy)."""


def load_policy(policy):
    """The exported policy: a dict as written by export-policy, or the path of its JSON file."""
    if isinstance(policy, dict):
        plan, where = policy, "the policy"
    else:
        where = str(policy)
        with open(policy, encoding="utf-8") as f:
            plan = json.load(f)
    if not isinstance(plan, dict) or plan.get("format") != FORMAT:
        if isinstance(plan, dict) and ("forward_prefetch" in plan or "units" in plan):
            raise PolicyError(
                f"{where} is an fsdplab policy, not one resolved for a framework: run "
                "`fsdplab export-policy POLICY.json --trace TRACE --to fsdp2 --format json "
                "-o OUT.json` and apply OUT.json"
            )
        raise PolicyError(f"{where}: not an exported policy (format {FORMAT!r} expected)")
    if plan.get("version") != 1:
        raise PolicyError(f"{where}: version {plan.get('version')!r} is not supported (1 is)")
    return plan


def _named(model, plan):
    """FQN -> module for every name the policy uses; every missing name is an error."""
    named = dict(model.named_modules())
    wanted = []
    for m in plan["modules"]:
        wanted.append(m["fqn"])
        wanted.extend(m.get("forward_prefetch", []))
        wanted.extend(m.get("backward_prefetch", []))
    missing = sorted({n for n in wanted if n not in named})
    if missing:
        raise PolicyError(
            "the model has no module named "
            + ", ".join(repr(n) for n in missing)
            + " (the policy names modules by model.named_modules(); the root is '')"
        )
    return named


def _fsdp2(named, fqn):
    module = named[fqn]
    if not hasattr(module, "set_modules_to_forward_prefetch"):
        raise PolicyError(
            f"module {fqn!r} ({type(module).__name__}) is not an FSDP2 module: call "
            "fully_shard on it before apply_policy"
        )
    return module


def apply_policy(model, policy):
    """Applies an exported policy to `model` and returns its notes (what the framework could not
    express). FSDP2: call after fully_shard and before the first forward."""
    plan = load_policy(policy)
    named = _named(model, plan)
    framework = plan.get("framework")
    if framework == "fsdp2":
        for m in plan["modules"]:
            module = _fsdp2(named, m["fqn"])
            if "forward_prefetch" in m:
                module.set_modules_to_forward_prefetch(
                    [_fsdp2(named, n) for n in m["forward_prefetch"]]
                )
            if "backward_prefetch" in m:
                module.set_modules_to_backward_prefetch(
                    [_fsdp2(named, n) for n in m["backward_prefetch"]]
                )
            module.set_reshard_after_forward(bool(m["reshard_after_forward"]), recurse=False)
    elif framework != "megatron-fsdp":
        raise PolicyError(f"framework {framework!r} is not one export-policy writes")
    return list(plan.get("notes", []))


def fully_shard_kwargs(policy, fqn):
    """Megatron-FSDP v2: the keyword arguments of fully_shard() for module `fqn`: its
    SchedulePolicy with the forward and backward prefetch element budgets and the MXFP8 opt-in."""
    plan = load_policy(policy)
    if plan.get("framework") != "megatron-fsdp":
        raise PolicyError("fully_shard_kwargs reads a policy exported --to megatron-fsdp")
    for m in plan["modules"]:
        if m["fqn"] == fqn:
            break
    else:
        raise PolicyError(f"the policy has no module named {fqn!r}")
    from megatron_fsdp.experimental.module import SchedulePolicy  # noqa: PLC0415 (optional)

    return {
        "schedule_policy": SchedulePolicy(
            forward_prefetch_elements=m["forward_prefetch_elements"],
            backward_prefetch_elements=m["backward_prefetch_elements"],
            unshard_all_planes_in_backward=m["unshard_all_planes_in_backward"],
        )
    }
