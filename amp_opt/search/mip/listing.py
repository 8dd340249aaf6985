"""``--top-k K`` on the MIP path: the K best plans, listed exactly wherever the enumerator can walk.

A program yields one plan per candidate, but the K best plans of a space mostly share their
candidate (a runner-up moves a layer or swaps two groups).  So before the programs run, the
candidates, in order of their lower bound and while it is below the K-th best plan so far, are
listed exactly by the enumerator's k best paths (:func:`amp_opt.search.enumerate.best_plans`),
each one whose free-grouping graph the enumerator can walk (MAX_TRANSITIONS).  The programs then
see the listed plans in their cutoff and solve only the candidates left, one plan each.  The list
is exact when no candidate left to a program has a bound below the final K-th plan
(``formulations/exactness.md``, "The k best plans"); otherwise the result names those candidates.
A run reports them with their bounds (``top_k_open``, ``top_k_stopped`` in its statistics), and
the search over sets of devices, which knows the K-th plan over all of them, words the result
(:func:`left_out`, called by :mod:`amp_opt.search.subsets`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...errors import SearchTooLarge
from ...model.plan import describe_candidate
from ..enumerate import best_plans, plan_key
from ..free_grouping import Stopped, candidate_graph
from ..result import SAME, Incumbent
from ..route import walk_estimate
from ..tuning import MAX_TRANSITIONS


@dataclass
class Listing:
    """What the exact listing did: the plans (best first, distinct, at most K), the candidates
    listed in full (their bound: their best path, or the limit they were listed to), and those
    it could not walk."""

    found: list[Incumbent] = field(default_factory=list)
    bound: dict = field(default_factory=dict)
    too_large: list = field(default_factory=list)
    stopped: bool = False


class PlanKeys:
    """Each incumbent's plan key (:func:`~amp_opt.search.enumerate.plan_key`), computed once."""

    def __init__(self, instance):
        self.instance, self._cache = instance, {}

    def __call__(self, inc: Incumbent) -> str:
        hit = self._cache.get(id(inc))
        if hit is None:  # the incumbent is kept with its key, so its id is not reused
            hit = self._cache[id(inc)] = (inc, plan_key(self.instance, inc.plan))
        return hit[1]

    def distinct(self, plans) -> list[Incumbent]:
        """``plans`` best first, each plan once (at its least value)."""
        out, seen = [], set()
        for inc in sorted(plans, key=Incumbent.key):
            if self(inc) not in seen:
                seen.add(self(inc))
                out.append(inc)
        return out

    def kth(self, plans, top_k: int, cutoff: float) -> float:
        """The K-th best value among ``plans``, each plan counted once, capped by ``cutoff``."""
        best: dict = {}
        for inc in plans:
            best[self(inc)] = min(best.get(self(inc), np.inf), inc.value)
        values = sorted(best.values())
        return min(values[top_k - 1] if len(values) >= top_k else np.inf, cutoff)


def list_candidates(search, cands, lower: dict, incumbents: dict, keys: PlanKeys) -> Listing:
    """List exactly the K best plans of every candidate that can matter and that the enumerator
    can walk (at most MAX_TRANSITIONS, the enumerator's own limit), lowest bound first; stops at
    the search's clock (then ``stopped``)."""
    opts, instance = search.options, search.instance
    max_transitions = MAX_TRANSITIONS
    out = Listing()
    for c in sorted(cands, key=lambda c: (lower[c], c)):
        # The other candidates' plans count too: each is a real plan, so the K-th of them is a cutoff
        # (not this one's own: it is listed again now).
        others = [inc for x, inc in incumbents.items() if x not in out.bound and x != c]
        kth = keys.kth(out.found + others, opts.top_k, opts.cutoff)
        if lower[c] >= kth:
            break  # the candidates after it have bounds at least as high
        if opts.placement == "free" and walk_estimate(instance, c) > max_transitions:
            out.too_large.append(c)
            continue
        try:
            graph, to_plan = candidate_graph(search.tables, c, search.model, opts.placement, search.chunks(c),
                                             stop=search.out_of_time, max_transitions=max_transitions)
        except SearchTooLarge:
            out.too_large.append(c)
            continue
        except Stopped:
            out.stopped = True
            break
        kept = list(out.found)
        first = best_plans(graph, to_plan, c, out.found, top_k=opts.top_k, cutoff=kth, stop=search.out_of_time,
                           instance=instance)
        if search.out_of_time():  # its paths may be cut short: it is not listed
            out.found, out.stopped = kept, True
            break
        out.bound[c] = kth if first is None else min(first, kth)
    return out


def open_candidates(listing: Listing, bound: dict, kth: float) -> list[tuple[str, float]]:
    """The candidates a program solved (one plan each) whose bound is below ``kth`` (seconds):
    each may hold a second plan among the K best.  (name, bound) pairs, lowest bound first."""
    out = [(describe_candidate(c), float(bound.get(c, -np.inf))) for c in listing.too_large
           if bound.get(c, -np.inf) < kth * (1 - SAME)]
    return sorted(out, key=lambda x: x[1])


def left_out(names: list[str], stopped: bool) -> str | None:
    """What a K-best list may miss, said once (None when it is the K best plans): the candidates
    too large to list whose bound is below the final K-th plan, named, or a listing cut short."""
    if stopped:
        return "the K best plans of the candidates listed before the time limit, one plan for the others (--top-k)"
    if not names:
        return None
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (f"one plan for each candidate whose free grouping is too large to list: {shown} "
            "(--top-k lists the K best plans of the others)")
