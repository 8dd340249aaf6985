"""The derived tables of an instance that a solve computes once and reuses.

An :class:`Instance` is immutable and holds no caches.  Whoever needs derived
tables many times (a solve, an evaluation, a bound) owns a :class:`Tables` and
passes it on: per-layer times per (device type, link, tp, micro-batch) and
per-layer parameter and activation sums per tp degree.
"""

from __future__ import annotations

import numpy as np

from .profiles import LayerTimes, layer_times
from .ranges import grid


class LayerSums:
    """Parameters per rank at one tp degree, summed over any range [k, l) of the layers in
    ``order`` (a permutation; the layer list's own order when None), tied tensors once."""

    def __init__(self, instance, tp: int, order=None):
        layers = instance.layers if order is None else [instance.layers[i] for i in order]
        self.params = np.array([layer.params.at(tp) for layer in layers])
        self._params_prefix = np.concatenate([[0.0], np.cumsum(self.params)])
        # A tie group's shared tensor is held once per stage: per rank, the smallest
        # member's declared shared count (default: its whole params) split over tp.
        groups: dict[str, list[int]] = {}
        for i, layer in enumerate(layers):
            if layer.tie is not None:
                groups.setdefault(layer.tie, []).append(i)
        self.ties: list[tuple[np.ndarray, float]] = []  # (member layers, per-rank shared parameters)
        for members in groups.values():
            if len(members) > 1:
                shared = min(
                    layers[i].tied_params / tp if layers[i].tied_params is not None else self.params[i] for i in members
                )
                self.ties.append((np.array(members), min(shared, *(self.params[i] for i in members))))
        self._n = len(layers)  # the range grid is not built here: (L+1)^2 cells are 75 GiB at 10^5 layers
        self._on_grid: np.ndarray | None = None

    def params_in(self, k, l):
        """Parameters per rank held by a stage of layers [k, l); tied tensors once.  Over every
        range of the model (:func:`~amp_opt.model.ranges.grid`) the table is computed once."""
        # Only a caller holding arrays of the grid's shape can hold the grid, so only then is it fetched.
        if getattr(k, "shape", None) == (self._n + 1, self._n + 1) and k is grid(self._n).start \
                and l is grid(self._n).stop:
            if self._on_grid is None:
                self._on_grid = self._params_in(np.asarray(k), np.asarray(l))
                self._on_grid.flags.writeable = False
            return self._on_grid
        return self._params_in(np.asarray(k), np.asarray(l))

    def _params_in(self, k: np.ndarray, l: np.ndarray):
        total = self._params_prefix[l] - self._params_prefix[k]
        for members, shared in self.ties:
            inside = ((k[..., None] <= members) & (members < l[..., None])).sum(axis=-1)
            total = total - np.maximum(inside - 1, 0) * shared
        return total


class Tables:
    """Remembered layer times and layer sums of one instance.

    Examples
    --------
    >>> from amp_opt import load_instance
    >>> tables = Tables(load_instance("instances/amp_homogeneous.json"))
    >>> tables.layer_sums(2) is tables.layer_sums(2)
    True
    """

    def __init__(self, instance):
        self.instance = instance
        self._times: dict[tuple, LayerTimes] = {}
        self._sums: dict[tuple, LayerSums] = {}

    def layer_times(self, device_type: str, intra_bw: float, tp: int, micro_batch: int) -> LayerTimes:
        """Seconds per layer for one micro-batch (eq. H2), see :func:`amp_opt.model.profiles.layer_times`."""
        key = (device_type, intra_bw, tp, micro_batch)
        if key not in self._times:
            self._times[key] = layer_times(self.instance, device_type, intra_bw, tp, micro_batch)
        return self._times[key]

    def layer_sums(self, tp: int, order=None) -> LayerSums:
        """Layer sums at a tp degree, over the layers in ``order`` (a permutation) or the list's own."""
        key = (tp, None if order is None else tuple(int(i) for i in order))
        if key not in self._sums:
            self._sums[key] = LayerSums(self.instance, tp, order)
        return self._sums[key]
