"""The optimizer: meta.optimizer and meta.master_weights from the optimizer given to the Recorder,
and, given the optimizer itself, its step() and zero_grad() timed inside rec.step() as the
step's optimizer compute."""

import warnings

import torch


def optimizer_meta(optimizer):
    """(meta.optimizer, whether the optimizer's parameters are fp32) for an optimizer or name."""
    if isinstance(optimizer, str):
        if optimizer not in ("adam", "sgd", "none"):
            raise ValueError(
                f"fsdplab.torch: optimizer={optimizer!r}: expected 'adam', 'sgd' or 'none', "
                "or a torch.optim.Optimizer"
            )
        return optimizer, True
    cls = type(optimizer).__name__
    groups = getattr(optimizer, "param_groups", None)
    if groups is None:
        raise ValueError(f"fsdplab.torch: optimizer={cls}: expected a torch.optim.Optimizer")
    if cls in ("Adam", "AdamW"):
        name = "adam"
    elif cls == "SGD":
        name = "sgd" if any(g.get("momentum", 0) for g in groups) else "none"
    else:
        raise ValueError(
            f"fsdplab.torch: optimizer={cls}: only Adam, AdamW and SGD are known; pass "
            "optimizer='adam', 'sgd' or 'none' for the state it keeps"
        )
    params = [p for g in groups for p in g["params"]]
    master_fp32 = bool(params) and all(p.dtype == torch.float32 for p in params)
    return name, master_fp32


class OptimizerMixin:
    """The Recorder's optimizer timing: wraps self._optimizer_obj's step() and zero_grad()
    (self._optimizer_patches) while a step is recorded; their spans go to
    self._optimizer_spans."""

    def _patch_optimizer(self):
        opt = self._optimizer_obj
        if opt is None:
            return
        for name in ("step", "zero_grad"):
            self._optimizer_patches.replace(opt, name, self._make_optimizer_wrapper)

    def _make_optimizer_wrapper(self, original):
        def wrapper(*args, **kwargs):
            if not self._active:
                return original(*args, **kwargs)
            if self._events is not None:
                # Inside a pass (before its backward_end): not the optimizer step of a step.
                warnings.warn(
                    "fsdplab.torch: the optimizer ran while a forward or backward was open; "
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
        self._optimizer_patches.restore()
