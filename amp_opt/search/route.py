"""Which solver ``auto`` runs, decided from the instance's size before any search starts.

The exact enumerator walks every free grouping of every candidate
(:mod:`amp_opt.search.free_grouping`), which is quick on a few nodes and hopeless on many; it
gives up past MAX_TRANSITIONS transitions of one candidate, but walking that far takes
seconds per candidate.  So ``auto`` estimates the walk first, with no walking:

* The walk's states after s stages are, per node class of k identical nodes of g
  groups, the multisets of groups left per node: partitions that fit in a k x g box.
  Their counts by total are the coefficients of the Gaussian binomial [k+g, k](x),
  computed with the recursion G(k, g) = G(k, g-1) + x^g G(k-1, g); the product over
  classes counts whole states, and its coefficient at s * d (d = dp x cp groups per stage;
  the box is symmetric) those after s stages.
* Moves per state are estimated by the first stage's count T1 (the coefficient at d:
  the ways to take d groups), the last stage has one move per state, so a candidate
  has about ``T1 + T1 * sum_{0<s<p-1} N_s + N_{p-1}`` transitions.  The walk also
  remembers which single node hosted the previous stage and its link, which multiplies
  the states; ``FLAG_FACTOR`` covers that (measured: 0.3x to 3.5x of the count above on
  the paper and 64-GPU instances before the factor).

``auto`` runs the enumerator when no candidate's estimate passes MAX_TRANSITIONS and
the whole DP work (transitions x layer ranges per stage, summed over candidates) stays
under AUTO_CELLS; otherwise CP-SAT.  Computing the estimate takes milliseconds; clusters
with more than MAX_GROUPS tensor-parallel groups go to CP-SAT without it.
"""

from __future__ import annotations

import numpy as np

from ..model.candidates import candidates
from ..model.classes import node_classes
from .tuning import AUTO_CELLS, FLAG_FACTOR, MAX_GROUPS, MAX_TRANSITIONS


def _box(k: int, g: int) -> np.ndarray:
    """Coefficients of the partitions that fit in a k x g box, by size (float, may be huge)."""
    if k == 0 or g == 0:
        return np.ones(1)
    prev = [np.ones(1)] * (g + 1)  # G(0, j) = 1
    for kk in range(1, k + 1):
        cur = [np.ones(1)]
        for j in range(1, g + 1):
            out = np.zeros(kk * j + 1)
            out[:len(cur[j - 1])] += cur[j - 1]
            out[j:j + len(prev[j])] += prev[j]
            cur.append(out)
        prev = cur
    return prev[g]


def walk_estimate(instance, cand) -> float:
    """About how many transitions the free-grouping walk of a candidate has (module doc)."""
    poly = np.ones(1)
    for c in node_classes(instance):
        poly = np.convolve(poly, _box(len(c.nodes), c.devices // cand.tp))
    d, p = cand.replicas, cand.pp  # tensor-parallel groups per stage (dp x cp)
    coef = lambda r: float(poly[r]) if r < len(poly) else 0.0  # noqa: E731
    if p == 1:
        return 1.0
    middle = sum(coef(s * d) for s in range(1, p - 1))
    return FLAG_FACTOR * (coef(d) + coef(d) * middle + coef((p - 1) * d))


def enumerator_fits(instance, placement: str) -> tuple[bool, str]:
    """Whether ``auto`` should run the enumerator, and why (a phrase for the solver record)."""
    if placement != "free":
        return True, "fixed placement: one grouping per candidate"
    groups = {m: sum(n.devices // m for n in instance.nodes) for m in {c.tp for c in candidates(instance)}}
    if any(g > MAX_GROUPS for g in groups.values()):
        return False, f"more than {MAX_GROUPS} tensor-parallel groups"
    L = instance.num_layers
    cells = 0.0
    for cand in candidates(instance):
        walk = walk_estimate(instance, cand)
        if walk > MAX_TRANSITIONS:
            return False, (f"free grouping of tp={cand.tp} cp={cand.cp} dp={cand.dp} pp={cand.pp} has about "
                           f"{walk:.2g} stage transitions (the enumerator stops at {MAX_TRANSITIONS})")
        cells += walk * (L + 1) * (L - cand.pp + 2)
    if cells > AUTO_CELLS:
        return False, f"about {cells:.2g} DP cells over all candidates (auto enumerates up to {AUTO_CELLS:.0e})"
    return True, f"about {cells:.2g} DP cells over all candidates"
