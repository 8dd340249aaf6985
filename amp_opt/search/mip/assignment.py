"""Layers to stages, the second formulation: assignment variables with textbook contiguity rows
(``formulations/mip.md``, eq. A1-A4).

x[l,s] = 1 when layer l runs on stage s.  Each layer takes one stage (A1); the stage
index sigma(l) = sum_s s x[l,s] never decreases and grows by at most one from a layer to
the next (A2: contiguity, aggregated into two rows per pair of layers); every stage holds a
layer (A3); b[s,l] >= x[l,s] - x[l+1,s] marks the last layer of stage s (A4), pushed down by
the p2p rows it feeds.  Integer points are exactly the contiguous partitions into
non-empty stages, as with the prefix variables of :mod:`.layers`, so the two formulations
have the same optimum; what differs is the linear relaxation and the branching: the prefix
rows Y[s,l] >= Y[s,l+1], Y[s+1,l] >= Y[s,l] are a network matrix (every vertex of the
layer polytope is a partition), while the aggregated rows A2 admit fractional vertices.
The interface (``z``, ``e``, ``before``, ``params``, ``boundaries``, ``hint``) is :class:`~.layers.PrefixLayers`'s.
"""

from __future__ import annotations

from .layers import _StageParams
from .linear import BIN, LinearModel, lin


class AssignmentLayers(_StageParams):
    """The layer-assignment part of a program over ``L`` layers and ``p`` stages (eq. A1-A4);
    ``fixed`` (stage boundaries) pins it, as interleaving's chunks do."""

    def __init__(self, mdl: LinearModel, sums, L: int, p: int, fixed=None):
        self.mdl, self.sums, self.L, self.p = mdl, sums, L, p
        self.x = {}
        for l in range(L):
            # Stages are non-empty, so layer l sits on a stage in [l - (L - p), l].
            for s in range(max(0, l - (L - p)), min(l, p - 1) + 1):
                on = 1 if fixed is None else int(fixed[s] <= l < fixed[s + 1])
                self.x[l, s] = mdl.var(f"x[{l},{s}]", 0 if fixed is None else on, on, BIN)
        for l in range(L):  # (A1) one stage per layer
            mdl.add(lin(*[self.z(s, l) for s in range(p)]), "==", 1, "count", f"assign[{l}]")
        for l in range(L - 1):  # (A2) sigma(l) <= sigma(l+1) <= sigma(l) + 1
            step = lin(self.sigma(l + 1), (-1.0, self.sigma(l)))
            mdl.add(step, ">=", 0, "count", f"monotone[{l}]")
            mdl.add(step, "<=", 1, "count", f"step[{l}]")
        for s in range(p):  # (A3) non-empty stages
            mdl.add(lin(*[self.z(s, l) for l in range(L)]), ">=", 1, "count", f"nonempty[{s}]")
        # (A4) b[s,l] >= x[l,s] - x[l+1,s]: layer l ends stage s.
        self.b = {}
        for s in range(p - 1):
            for l in range(L - 1):
                if (l, s) in self.x:
                    self.b[s, l] = mdl.var(f"b[{s},{l}]", 0, 1, BIN)
                    mdl.add(lin({self.b[s, l]: 1}, (-1.0, self.z(s, l)), self.z(s, l + 1)), ">=", 0, "count",
                            f"last[{s},{l}]")
        self._tie_rows()

    def sigma(self, l: int) -> dict:
        """The stage index of layer l, sum_s s x[l,s]."""
        return lin(*[(float(s), {self.x[l, s]: 1.0}) for s in range(self.p) if (l, s) in self.x])

    def z(self, s: int, l: int) -> dict:
        """Layer l runs on stage s."""
        return {self.x[l, s]: 1.0} if (l, s) in self.x else {}

    def before(self, s: int, l: int) -> dict:
        """Layer l runs on a stage before s."""
        return lin(*[self.z(t, l) for t in range(s)])

    def e(self, s: int, l: int) -> dict:
        """Layer l is stage s's last layer (an upper bound the p2p rows push down to it)."""
        if l == self.L - 1:
            return self.z(s, l)
        return {self.b[s, l]: 1.0} if (s, l) in self.b else {}

    def boundaries(self, values: dict) -> tuple[int, ...]:
        """The plan's partition: partition[s+1] = number of layers on stages <= s."""
        stage = [max(range(self.p), key=lambda s: values[self.x[l, s]] if (l, s) in self.x else -1.0)
                 for l in range(self.L)]
        return (0, *(sum(1 for k in stage if k <= s) for s in range(self.p - 1)), self.L)

    def hint(self, boundaries, hint: dict) -> None:
        """The variables' values for a plan's partition."""
        for (l, s), v in self.x.items():
            hint[v] = 1.0 if boundaries[s] <= l < boundaries[s + 1] else 0.0
        for (s, l), v in self.b.items():
            hint[v] = 1.0 if l == boundaries[s + 1] - 1 else 0.0
        for s in range(self.p):
            k, l = boundaries[s], boundaries[s + 1]
            for t, (members, _) in enumerate(self.sums.ties):
                hint[self.any[s, t]] = float(any(k <= int(i) < l for i in members))
