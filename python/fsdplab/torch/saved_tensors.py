"""Saved-tensor sizes: the bytes of the activations autograd saves for backward in each forward
or recompute compute, through saved-tensor hooks (every torch the recorder runs on; without the
dispatch-mode probe these are a compute's saved_bytes)."""

import torch


def saved_tensors_hooks_available():
    return hasattr(torch.autograd.graph, "saved_tensors_hooks")


class SavedTensorsMixin:
    """The Recorder's saved-tensor hooks: the pack hook hands each tensor to the innermost open
    frame (self._stack); _measure_saved counts them against self._param_ptrs when the frame's
    compute is emitted."""

    def _saved_tensors_hooks(self):
        """The context that installs the hooks for the step."""
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

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
        t0 = self._hook_enter()
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
        self._hook_leave(t0)

    @staticmethod
    def _unpack(t):
        return t
