"""Bytes of the tensors autograd keeps for backward, counted through saved_tensors_hooks.

Every tensor an autograd node saves passes through the pack hook.  A storage is
counted once however many saved tensors (views) share it, with its whole size
(``untyped_storage().nbytes()``), while any saved tensor still refers to it;
storages of parameters and buffers (model state, not activations) are excluded.
Saved inputs (a layer input a norm saves, token ids the embedding saves) are
counted: they are kept alive for backward like any activation.  Not seen: tensors
a custom Function keeps as plain attributes (the rotary cos/sin tables, constants
shared by every micro-batch).
"""

from __future__ import annotations

from ._torch import require_torch

torch = require_torch()


class _Handle:
    __slots__ = ("tracker", "key", "tensor", "__weakref__")

    def __init__(self, tracker, key, tensor):
        self.tracker, self.key, self.tensor = tracker, key, tensor

    def __del__(self):
        self.tracker._release(self.key)


def _key(tensor):
    storage = tensor.untyped_storage()
    return (str(tensor.device), storage.data_ptr(), storage.nbytes())


class SavedTensorTracker:
    """Live and peak bytes of saved activations, while the context is active.

    Parameters
    ----------
    exclude : iterable of modules or tensors
        Parameters and buffers of these modules (or these tensors) are model
        state: their storages are not counted.
    limit : int, optional
        Raise ``torch.OutOfMemoryError`` when reserved + live + extra bytes exceed it.
    reserved : int
        Bytes already taken toward ``limit`` (model state, buffers the caller holds); not
        part of ``live`` or ``peak``.

    Examples
    --------
    >>> import torch
    >>> lin = torch.nn.Linear(4, 4)
    >>> with SavedTensorTracker(exclude=[lin]) as tracker:
    ...     y = lin(torch.randn(2, 4)).sum()
    >>> tracker.live  # the input, 2 x 4 fp32
    32
    """

    def __init__(self, exclude=(), limit: int | None = None, reserved: int = 0):
        self.limit = limit  # bytes; beyond it torch.OutOfMemoryError (a CPU stand-in for a device's capacity)
        self.reserved = reserved
        self._exclude = set()
        for item in exclude:
            tensors = list(item.parameters()) + list(item.buffers()) if isinstance(item, torch.nn.Module) else [item]
            self._exclude.update(_key(t)[:2] for t in tensors)
        self._refs: dict = {}
        self.live = 0
        self.peak = 0
        self.extra = 0  # other live bytes the caller reports (pipeline buffers)
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, tensor):
        key = _key(tensor)
        if key[:2] in self._exclude:
            return tensor
        entry = self._refs.get(key)
        if entry is None:
            self._refs[key] = [1, key[2]]
            self.live += key[2]
            self._update_peak()
        else:
            entry[0] += 1
        return _Handle(self, key, tensor)

    @staticmethod
    def _unpack(handle):
        return handle.tensor if isinstance(handle, _Handle) else handle

    def _release(self, key):
        entry = self._refs.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            del self._refs[key]
            self.live -= entry[1]

    def _update_peak(self):
        self.peak = max(self.peak, self.live + self.extra)
        if self.limit is not None and self.reserved + self.live + self.extra > self.limit:
            what = (f"tracked memory {self.reserved + self.live + self.extra} bytes ({self.reserved} of model state "
                    f"and reserve, {self.live + self.extra} of activations and buffers)" if self.reserved else
                    f"tracked activations {self.live + self.extra} bytes")
            raise torch.OutOfMemoryError(f"{what} exceed the memory limit {self.limit} bytes")

    def add_extra(self, nbytes: int) -> None:
        """Report other live bytes (positive) or their release (negative)."""
        self.extra += nbytes
        self._update_peak()

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        return False


def saved_activation_bytes(fn, *, exclude=()) -> int:
    """Bytes autograd saves while ``fn()`` runs (each storage once, state excluded).

    The result of ``fn`` is kept alive until the count is taken, then dropped.

    Examples
    --------
    >>> import torch
    >>> lin = torch.nn.Linear(4, 4)
    >>> saved_activation_bytes(lambda: lin(torch.randn(3, 4)), exclude=[lin])
    48
    """
    with SavedTensorTracker(exclude=exclude) as tracker:
        out = fn()
        nbytes = tracker.live
    del out
    return nbytes


def tensor_bytes(tensor) -> int:
    """Bytes of a tensor's elements (not of its storage)."""
    return tensor.numel() * tensor.element_size()
