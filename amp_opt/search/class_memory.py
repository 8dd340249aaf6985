"""What memory lets a block of the class-stage space hold (S9, S12, S14 of
``formulations/uneven-search.md``): a stage's room in parameters per rank, the activations its
micro-batches in flight keep at the least (with the layer a recomputing stage rebuilds, per
range), the most reference seconds a block's stages hold
(a fractional knapsack), and whether a set of blocks has more stages than layers that fit them.
:class:`~.class_bounds.Bounds` reads them for S7, S11 and the walk's key.
"""

from __future__ import annotations

import itertools

import numpy as np

from ..model.costs.terms import framework_bytes, kept_bytes, state_bytes_per_param
from ..model.plan import Candidate
from ..model.ranges import INF, grid, range_table
from .class_stages import Block, zero_stages


class BlockMemory:
    """S9 and S12 for the blocks of one instance under a cost ``model`` (``classes``: its node
    classes); every bound is void (INF room, never crowded) where the model ignores memory or
    (``holds`` false) prices with methods of its own."""

    def __init__(self, instance, tables, model, classes, holds: bool):
        self.instance, self.tables, self.model, self.classes, self.holds = instance, tables, model, classes, holds
        self._rooms: dict = {}
        self._held: dict = {}
        self._leans: dict = {}
        self._kept: dict = {}
        self._ways: dict = {}  # S14 per tp: the ways a stage keeps its activations, per layer
        self._way_tables: dict = {}  # and over every range
        self._flight: dict = {}
        self._crowded: dict = {}

    def lean(self, tp: int) -> tuple[np.ndarray, np.ndarray]:
        """Per layer its parameters per rank at ``tp`` with a tie group's shared tensor taken off
        every member (a stage holds at least their sum: S9), and which layers are tied."""
        if tp not in self._leans:
            sums = self.tables.layer_sums(tp)
            params, tied = np.array(sums.params, dtype=float), np.zeros(len(sums.params), dtype=bool)
            for members, shared in sums.ties:
                params[members] -= shared
                tied[members] = True
            self._leans[tp] = (np.maximum(params, 0.0), tied)
        return self._leans[tp]

    def _per_param(self, dp: int) -> float:
        """The least model-state bytes per parameter over the ZeRO stages a configuration may take (H9)."""
        tr = self.instance.training
        return min((state_bytes_per_param(tr, dp, z) for z in zero_stages(self.instance)), default=0.0)

    def room(self, b: Block) -> float:
        """S9: the most parameters per rank one stage of the block holds: its type's capacity less
        the framework's bytes (a pipeline neighbour's buffers left out), over the least model-state
        bytes per parameter of the ZeRO stages the search tries, through the allocator (the
        activations are weighed in :meth:`kept`).  INF where the cost model ignores memory."""
        key = (b.cls, b.tp, b.dp)
        if key not in self._rooms:
            inst = self.instance
            tr = inst.training
            per_param = self._per_param(b.dp)
            if not self.model.enforces_memory or per_param <= 0:
                self._rooms[key] = INF
            else:
                free = (inst.device_types[self.classes[b.cls].device_type].capacity
                        - framework_bytes(tr, Candidate(b.tp, b.dp, 1, b.share)))
                self._rooms[key] = max(free, 0.0) / ((1.0 + tr.fragmentation) * per_param)
        return self._rooms[key]

    def kept(self, b: Block) -> np.ndarray:
        """S9: per layer, the least bytes of activations one micro-batch of the block's share keeps
        on a stage (the least over the search's sequence-parallel values and recomputation modes,
        H7: the least over :meth:`ways`), in :meth:`room`'s parameters (divided by the least
        model-state bytes per parameter)."""
        key = (b.tp, b.dp, b.share)
        if key not in self._kept:
            ways = self.ways(b.tp)
            per_param = self._per_param(b.dp)
            self._kept[key] = (np.zeros(self.instance.num_layers) if not ways or per_param <= 0
                               else np.maximum(np.min([kept for kept, _, _ in ways], axis=0), 0.0)
                               * b.share / per_param)
        return self._kept[key]

    def ways(self, tp: int) -> list[tuple[np.ndarray, np.ndarray, bool]]:
        """S14: per way a stage may keep its activations (a sequence-parallel value of the search
        and its recomputation: each mode for the whole stage, and "full" on the stage's first layers
        where ``search.recompute_layers`` allows it), per layer the bytes one sample keeps at the
        least (times the activation factor) and the bytes rebuilt while a recomputed layer's
        backward runs (0 where it does not recompute), and whether that rebuilt buffer is the range's
        largest (the whole stage recomputes) or only its first layer's (a block of its first layers
        does).  Bytes, before a block's share and state bytes per parameter."""
        if tp not in self._ways:
            space, factor = self.instance.search, self.instance.training.activation_factor
            out = []
            for sp in space.sequence_parallel:
                per = self.tables.layer_arrays(tp, sp)
                modes = kept_bytes(per, factor)
                rebuilt = np.where(per.recomputes, per.rebuilt, 0.0) * factor
                none = np.zeros(len(rebuilt))
                for mode in space.recompute:
                    out.append((np.asarray(modes[mode], dtype=float), rebuilt if mode == "full" else none, True))
                if "full" in space.recompute and space.recompute_layers:
                    out.append((np.asarray(modes["full"], dtype=float), rebuilt, False))
            self._ways[tp] = out
        return self._ways[tp]

    def _way_ranges(self, tp: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """:meth:`ways` over every range [k, l) of the layers: per way the bytes one sample keeps in
        the range and the rebuilt buffer (its largest layer's, or its first layer's)."""
        if tp not in self._way_tables:
            L = self.instance.num_layers
            out = []
            for kept, rebuilt, whole in self.ways(tp):
                table = np.zeros((L + 1, L + 1))
                for start in range(L):
                    table[start, start + 1:] = np.maximum.accumulate(rebuilt[start:]) if whole else rebuilt[start]
                out.append((range_table(kept), table))
            self._way_tables[tp] = out
        return self._way_tables[tp]

    def kept_in(self, b: Block, flight: int) -> np.ndarray:
        """S14: per range [k, l) of a stage of the block with ``flight`` micro-batches in flight,
        the least bytes its activations take (the least over :meth:`ways` of flight times what
        each micro-batch keeps plus the rebuilt buffer, each micro-batch ``b.share`` samples), in
        :meth:`room`'s parameters; INF where k >= l."""
        per_param = self._per_param(b.dp)
        tables = self._way_ranges(b.tp)
        if not tables or per_param <= 0:
            return np.where(grid(self.instance.num_layers).nonempty, 0.0, INF)
        least = np.min([flight * kept + rebuilt for kept, rebuilt in tables], axis=0)
        return least * (b.share / per_param)

    def held(self, b: Block, ref: np.ndarray) -> float:
        """S9: the most reference seconds the block's k stages hold within their memory, k times
        :meth:`room` parameters per rank (:func:`most_held` over each layer's parameters per rank
        at the block's tp, a tie group's shared tensor taken off every member, plus the activations
        one micro-batch keeps, :meth:`kept`)."""
        room = self.room(b)
        if room == INF:
            return INF
        key = (b.tp, b.dp, b.share, ref.tobytes())
        if key not in self._held:
            self._held[key] = _Knapsack(ref, self.lean(b.tp)[0] + self.kept(b))
        return self._held[key](b.stages * room)

    def fit_levels(self, b: Block, n: int) -> np.ndarray:
        """S12: per layer, the most micro-batches in flight (at most n) at which it fits alone on a
        stage of the block (its model state and those micro-batches' activations within the room,
        S9), the most over the ways of :meth:`ways` (S14: the rebuilt buffer counted where the
        whole stage recomputes; a stage holding the layer holds at least that); -1 where it fits
        at none."""
        key = (b.cls, b.tp, b.dp, b.share, n)
        if key not in self._flight:
            room, lean = self.room(b), self.lean(b.tp)[0]
            per_param = self._per_param(b.dp)
            ways = self.ways(b.tp)
            if room == INF:
                most = np.full(len(lean), n)
            elif not ways or per_param <= 0:
                most = np.where(lean <= room * (1 + 1e-12), n, -1)
            else:
                room *= 1 + 1e-12
                scale = b.share / per_param
                most = np.full(len(lean), -1.0)
                for kept, rebuilt, whole in ways:
                    need, per = lean + (scale * rebuilt if whole else 0.0), scale * kept
                    with np.errstate(divide="ignore", invalid="ignore"):
                        level = np.where(per > 0, np.floor((room - need) / per), n)
                    most = np.maximum(most, np.where(need <= room, np.minimum(level, n), -1))
            self._flight[key] = most.astype(int)
        return self._flight[key]

    def crowded(self, M: int, blocks) -> bool:
        """S12: whether some set of the blocks has more stages at F micro-batches in flight or more
        (all but F - 1 of them) than layers that fit alone on one of its stages there, for some
        F ≥ 1; every stage holds a layer of its own.  ``blocks`` may be some of a combination's
        (more blocks only add stages)."""
        blocks = tuple(b for b in blocks if b is not None)
        if not blocks or not self.holds:
            return False
        if (M, blocks) not in self._crowded:
            if len(self._crowded) > 100_000:  # the walk asks again for the blocks it keeps: a cache
                self._crowded.clear()
            self._crowded[M, blocks] = self._crowded_now(M, blocks)
        return self._crowded[M, blocks]

    def _crowded_now(self, M: int, blocks: tuple) -> bool:
        n = self.instance.training.global_batch // M
        levels = [self.fit_levels(b, n) for b in blocks]
        for r in range(1, len(blocks) + 1):
            for chosen in itertools.combinations(range(len(blocks)), r):
                stages = sum(blocks[i].stages for i in chosen)
                best = np.max([levels[i] for i in chosen], axis=0)
                F = np.arange(1, min(n, stages) + 1)
                if (np.count_nonzero(best[:, None] >= F[None, :], axis=0) < stages - F + 1).any():
                    return True
        return False


class _Knapsack:
    """:func:`most_held` for one (reference, parameters), sorted once for many budgets."""

    def __init__(self, ref: np.ndarray, params: np.ndarray):
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = np.where(params > 0, ref / params, INF)
        order = np.argsort(-rate, kind="stable")
        self.ref, self.params = ref[order], params[order]
        self.cum_params = np.cumsum(self.params)
        self.cum_ref = np.concatenate([[0.0], np.cumsum(self.ref)])

    def __call__(self, budget: float) -> float:
        whole = int(np.searchsorted(self.cum_params, budget, side="right"))  # layers held whole
        if whole == len(self.ref):
            return INF  # every layer fits: no limit
        before = self.cum_params[whole - 1] if whole else 0.0
        return float(self.cum_ref[whole] + self.ref[whole] * (budget - before) / self.params[whole])


def most_held(ref: np.ndarray, params: np.ndarray, budget: float) -> float:
    """The most of ``ref`` that layers of at most ``budget`` parameters in all hold, fractions of
    layers allowed (a fractional knapsack, most seconds per parameter first): a bound on the
    reference seconds of any set of layers within ``budget`` (S9); INF where every layer fits.

    Examples
    --------
    >>> most_held(np.array([3.0, 1.0, 2.0]), np.array([1.0, 1.0, 2.0]), 2.0)
    4.0
    >>> most_held(np.array([3.0, 1.0]), np.array([1.0, 1.0]), 2.0)
    inf
    """
    return _Knapsack(np.asarray(ref, dtype=float), np.asarray(params, dtype=float))(budget)
