"""Layers to stages in the programs: prefix variables (``formulations/mip.md`` eq. M1-M4).

Y[s,l] = 1 when layer l runs on a stage <= s.  Then z[s,l] = Y[s,l] - Y[s-1,l] (layer l
on stage s) and e[s,l] = Y[s,l] - Y[s,l+1] (l is stage s's last layer) are linear
expressions, not variables, and contiguity holds by construction.  Stage parameters
count a tied tensor once (M4) through any[s,t] (stage s holds a layer of tie group t).
"""

from __future__ import annotations

from .linear import BIN, CONST, LinearModel, lin


class _StageParams:
    """What both layer formulations write the same way from their ``z(s, l)`` (layer l runs on
    stage s): the tie rows and a stage's parameter count (M4)."""

    def _tie_rows(self) -> None:
        """(M4) A stage holding a layer of a tie group holds its shared tensor once."""
        self.any = {}
        for s in range(self.p):
            for t, (members, _) in enumerate(self.sums.ties):
                self.any[s, t] = self.mdl.var(f"any[{s},{t}]", 0, 1, BIN)
                for l in members:
                    self.mdl.add(lin({self.any[s, t]: 1}, (-1, self.z(s, int(l)))), ">=", 0, "count",
                                 f"tie[{s},{t},{l}]")

    def params(self, s: int) -> dict:
        """Parameters per rank of stage s, tied tensors once (M4)."""
        terms = [(float(self.sums.params[l]), self.z(s, l)) for l in range(self.L)]
        for t, (members, shared) in enumerate(self.sums.ties):
            terms += [(-shared, self.z(s, int(l))) for l in members]
            terms.append((shared, {self.any[s, t]: 1}))
        return lin(*terms)


class PrefixLayers(_StageParams):
    """The layer-assignment part of a program over ``L`` layers and ``p`` stages; ``fixed``
    (stage boundaries) pins it, as interleaving's chunks do."""

    def __init__(self, mdl: LinearModel, sums, L: int, p: int, fixed=None):
        self.mdl, self.sums, self.L, self.p = mdl, sums, L, p
        self.Y = {}
        for s in range(p - 1):
            for l in range(L):
                lo = 1 if l <= s else 0  # every stage is non-empty, so layer l <= s sits on a stage <= s
                hi = 0 if l >= L - (p - 1 - s) else 1  # leave a layer for each later stage
                if fixed is not None:
                    lo = hi = int(l < fixed[s + 1])
                self.Y[s, l] = mdl.var(f"Y[{s},{l}]", lo, hi, BIN)
        # (M1) prefix and order; (M2) non-empty stages.
        for s in range(p - 1):
            for l in range(L - 1):
                mdl.add(lin({self.Y[s, l]: 1}, (-1, {self.Y[s, l + 1]: 1})), ">=", 0, "count", f"prefix[{s},{l}]")
            if s < p - 2:
                for l in range(L):
                    mdl.add(lin({self.Y[s + 1, l]: 1}, (-1, {self.Y[s, l]: 1})), ">=", 0, "count", f"order[{s},{l}]")
        for s in range(p):
            mdl.add(lin(*[self.z(s, l) for l in range(L)]), ">=", 1, "count", f"nonempty[{s}]")
        self._tie_rows()

    def _Y(self, s: int, l: int) -> dict:
        if s < 0:
            return {}
        if s >= self.p - 1:
            return {CONST: 1.0}
        return {self.Y[s, l]: 1.0}

    def z(self, s: int, l: int) -> dict:
        """Layer l runs on stage s."""
        return lin(self._Y(s, l), (-1.0, self._Y(s - 1, l)))

    def e(self, s: int, l: int) -> dict:
        """Layer l is stage s's last layer."""
        return lin(self._Y(s, l), (-1.0, self._Y(s, l + 1))) if l < self.L - 1 else self._Y(s, l)

    def before(self, s: int, l: int) -> dict:
        """Layer l runs on a stage before s."""
        return self._Y(s - 1, l)

    def boundaries(self, values: dict) -> tuple[int, ...]:
        """(M3) The plan's partition: partition[s+1] = sum_l Y[s,l]."""
        return (0, *(int(round(sum(values[self.Y[s, l]] for l in range(self.L)))) for s in range(self.p - 1)),
                self.L)

    def hint(self, boundaries, hint: dict) -> None:
        """The variables' values for a plan's partition."""
        for s in range(self.p - 1):
            for l in range(self.L):
                hint[self.Y[s, l]] = 1.0 if l < boundaries[s + 1] else 0.0
        for s in range(self.p):
            k, l = boundaries[s], boundaries[s + 1]
            for t, (members, _) in enumerate(self.sums.ties):
                hint[self.any[s, t]] = float(any(k <= int(i) < l for i in members))
