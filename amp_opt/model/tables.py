"""The derived tables of an instance that a solve computes once and reuses.

An :class:`Instance` is immutable and holds no caches.  Whoever needs derived
tables many times (a solve, an evaluation, a bound) owns a :class:`Tables` and
passes it on: per-layer times per (device type, link, tp, micro-batch),
per-layer parameter sums per tp degree and per-layer activation and traffic
quantities per (tp, sequence parallelism).
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


class LayerArrays:
    """Per-layer quantities at one (tp, sequence parallelism) over the layers in ``order``, the
    candidate-independent inputs of :class:`~amp_opt.model.costs.terms.CandidateTerms`
    (per sample, before the calibrated activation factor and the context-parallel split)."""

    def __init__(self, instance, tp: int, sequence_parallel: bool, order=None):
        m, sp = tp, sequence_parallel
        ids = range(instance.num_layers) if order is None else [int(i) for i in order]
        layers = [instance.layers[i] for i in ids]
        self.activations = _frozen([layer.activation_memory_bytes.at(m, sp) for layer in layers])
        self.scores = _frozen([layer.attention_memory_bytes.at(m, sp) for layer in layers])
        self.recomputes = _frozen([layer.recomputes for layer in layers])
        inputs = [instance.layers[i - 1].activation_bytes if i > 0 else None for i in ids]
        self.kept_full = _frozen([_kept_full(layer, before, m, sp) for layer, before in zip(layers, inputs)])
        self.selective_share = _frozen([layer.attention_flops / layer.flops if layer.recomputes and layer.flops
                                        else 0.0 for layer in layers])
        self.sent = _frozen([layer.activation_bytes.at(m, sp) for layer in layers])
        self.kv = _frozen([layer.kv_bytes.at(m) for layer in layers])
        # What full recomputation rebuilds at once (the largest member of a block) and the
        # largest member's parameters (what ZeRO-3 gathers at once).
        self.rebuilt = _frozen([max(x.activation_memory_bytes.at(m, sp) for x in layer.members or (layer,))
                                for layer in layers])
        self.largest_params = _frozen([max(x.params.at(m) for x in layer.members or (layer,)) for layer in layers])


def _kept_full(layer, before, m: int, sp: bool) -> float:
    """Bytes per sample a layer keeps under full recomputation (eq. H7): its input, at most its
    own activations; a block of layers, the sum over its members."""
    total = 0.0
    for member in layer.members or (layer,):
        own = member.activation_memory_bytes.at(m, sp)
        total += 0.0 if before is None else min(before.at(m, sp), own)  # the first layer's input: the data
        before = member.activation_bytes
    return total


def _frozen(values) -> np.ndarray:
    out = np.array(values)
    out.flags.writeable = False
    return out


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
        self._arrays: dict[tuple, LayerArrays] = {}

    def recalibrated(self, instance) -> "Tables":
        """Tables of ``instance``, a recalibrated copy of this one (``apply_calibration``): the layer
        sums and per-layer arrays depend on no calibrated quantity, so they are shared; the layer
        times (compute scale, batch exponent, bandwidths) are not."""
        out = Tables(instance)
        out._sums, out._arrays = self._sums, self._arrays
        return out

    def with_batch(self, instance) -> "Tables":
        """Tables of ``instance``, this one's instance with another global batch (one pipeline of
        several, U6): no table reads the batch, so all of them are shared."""
        out = self.recalibrated(instance)
        out._times = self._times
        return out

    def layer_times(self, device_type: str, intra_bw: float, tp: int, micro_batch: int, *,
                    latency: float = 0.0) -> LayerTimes:
        """Seconds per layer for one micro-batch (eq. H2, H19), see :func:`amp_opt.model.profiles.layer_times`."""
        key = (device_type, intra_bw, tp, micro_batch, latency)
        if key not in self._times:
            self._times[key] = layer_times(self.instance, device_type, intra_bw, tp, micro_batch, latency=latency)
        return self._times[key]

    def layer_sums(self, tp: int, order=None) -> LayerSums:
        """Layer sums at a tp degree, over the layers in ``order`` (a permutation) or the list's own."""
        key = (tp, None if order is None else tuple(int(i) for i in order))
        if key not in self._sums:
            self._sums[key] = LayerSums(self.instance, tp, order)
        return self._sums[key]

    def layer_arrays(self, tp: int, sequence_parallel: bool, order=None) -> LayerArrays:
        """Per-layer quantities at (tp, sequence parallelism), over the layers in ``order`` or the list's own."""
        key = (tp, bool(sequence_parallel), None if order is None else tuple(int(i) for i in order))
        if key not in self._arrays:
            self._arrays[key] = LayerArrays(self.instance, tp, sequence_parallel, order)
        return self._arrays[key]
