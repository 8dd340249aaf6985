"""Phase 1b of the MIP driver: the stage-kind search on large free-grouping clusters.

``formulations/mip.md`` (eq. B4, K6): in rounds, every candidate whose lower bound is
more than the requested gap below the best plan gets more of the Lagrangian kind bound
(infinite once it proves the candidate has no plan); then the candidates with the
lowest bounds get plans built from their relaxed paths (kinds repaired to fit the
supply), and their incumbents re-ordered and re-partitioned keeping their kinds, at
the thresholds where the bound is weakest.  Under a time limit, while those plans
improve, the other candidates' bounds wait (plans first).  The MIPs' programs run
afterwards, warm-started from what this phase found.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from ..clock import Clock
from ..tuning import (BOUND_SHARE, KIND_MIN_NODES, KIND_PROGRESS, KIND_ROUNDS, KIND_SHARE, KIND_SWEEPS, PLANS_FIRST,
                      POLISH_CELLS, POLISH_WORK, POLISHED, QUICK_SHARE, QUICK_SWEEPS)
from .bound import KindSearch
from .construct import Pace, construct, polish
from .lagrangian import kind_model


@dataclass(frozen=True)
class RuledOut:
    """What stays of the kind search of a candidate whose bound reached the best plan: the bound
    (the best plan only gets better, in this run and the next, so it stays ruled out)."""

    bound: float


def runs_kinds(search) -> bool:
    """Whether phase 1b runs: free grouping (which the hetero model prices) on a cluster large
    enough for it to pay (on a few nodes the programs alone are exact in well under a second)."""
    return search.options.placement == "free" and len(search.instance.nodes) >= KIND_MIN_NODES


class KindPhase:
    """The kind searches of one solve's candidates, created on first use and kept between rounds."""

    def __init__(self, search):
        self.search = search
        self.searches: dict = {}  # candidate -> KindSearch, None (too many node classes) or RuledOut
        self.tried: set = set()  # (candidate, what) pairs already used to build plans
        self.pace = Pace()  # how fast the multiset DP runs here (its budgets are in seconds)

    def of(self, cand, best: float, clock: Clock | None = None) -> KindSearch | None:
        """The candidate's kind search (eq. B4), started at target ``best`` on first use (its first
        dual steps stop when ``clock`` runs out, by default the search's)."""
        if cand not in self.searches:
            model = kind_model(self.search.tables, cand, self.search.chunks(cand), self.search.model)
            clock = self.search.clock if clock is None else clock
            self.searches[cand] = None if model is None else KindSearch(model, min(best, model.ceiling), clock)
        return self.searches[cand]

    def kept(self, cand) -> bool:
        """Whether the candidate has a kind search that can raise its bound further."""
        return isinstance(self.searches.get(cand), KindSearch)

    def labelled_bound(self, cand, lower: float) -> float:
        """``lower`` raised to the labelled bound (eq. B2): one DP, a few to a few hundred
        milliseconds on 1024 GPUs against most of a second per round of the kind bound, and where
        the kind bound is slow to start it rules out most candidates the cheap bound (B3) leaves
        open.  Remembered per solve; skipped once out of time."""
        if self.search.out_of_time():
            return lower
        return max(lower, self.search.lower_bound(cand, labelled=True))

    def raise_bound(self, cand, best: float, sweeps: int, clock: Clock) -> float:
        """The candidate's kind bound raised towards ``best``, or infinity once it reaches the cost
        no plan of the candidate exceeds (``KindModel.ceiling``): then it has no plan at all."""
        search = self.searches[cand]
        if isinstance(search, RuledOut):
            return search.bound
        ceiling = search.model.ceiling
        value = search.raise_to(min(best, ceiling), sweeps, clock)
        return np.inf if value >= ceiling else value

    def quick_bound(self, cand, lower: float, best: float, clock: Clock | None = None) -> float:
        """A candidate's first try at being ruled out: its kind bound with a few DP paths (by
        ``clock``, by default the search's; under a time limit at most QUICK_SHARE of it), then,
        if that leaves it open, the labelled bound B2.  The kind bound first: building its tables
        alone often rules a candidate out, where B2 may take half a second."""
        if self.of(cand, best, clock) is None:
            return self.labelled_bound(cand, lower)
        clock = self.search.clock if clock is None else clock
        whole = self.search.clock
        if whole.deadline is not None:
            clock = clock.within(QUICK_SHARE * whole.budget)
        lower = max(lower, self.raise_bound(cand, best, QUICK_SWEEPS, clock))
        return lower if lower >= best else self.labelled_bound(cand, lower)

    def refine(self, incumbents: dict, lower: dict, best: float, gap: float) -> float:
        """Rounds of bound raising and plan building; updates ``incumbents`` and ``lower`` and
        returns the best value.  Spends at most KIND_SHARE of the time left; KIND_ROUNDS rounds,
        and under a time limit more while they pay, plans first in PLANS_FIRST of its time."""
        phase = self.search.clock.share(KIND_SHARE)
        focus = None if phase.deadline is None else phase.share(PLANS_FIRST)
        for round_ in itertools.count():
            # Open: candidates whose bound leaves more than the requested gap below the best plan.
            open_ = [c for c in sorted(lower, key=lambda c: (lower[c], c)) if lower[c] < best * (1 - gap)]
            before = (best, min([lower[c] for c in open_], default=np.inf))
            # The bounds may take BOUND_SHARE of the time left, so that plans get built every
            # round even when there are more candidates than one round of bounds can cover.
            # The candidates with the lowest bounds first, then their plans (the likeliest to be
            # better ones), then the bounds of the others: a better plan early rules more out.
            # The first bounds go on until POLISHED candidates stay open under them: the lowest
            # cheap bounds are often of candidates that a few DP paths rule out, and the plans are
            # worth building from those that stay open.
            bounds_stop = phase.share(BOUND_SHARE)
            raised = 0
            for c in open_:
                staying = [x for x in open_[:raised] if lower[x] < best and self.searches.get(x) is not None]
                if len(staying) >= POLISHED or bounds_stop.out_of_time():
                    break
                new = c not in self.searches
                self.raise_bounds([c], lower, best, bounds_stop)
                if new and focus is not None:  # a round of paths beyond the quick try: its plans need them
                    self.raise_bounds([c], lower, best, bounds_stop)
                raised += 1
            # Plans from the candidates whose bounds this round raised first (lowest bounds first),
            # then from the others by their bounds: a bound not raised yet is lower for want of
            # work, not for a better plan (formulations/mip.md, "Time").
            ranked = [c for c in sorted(lower, key=lambda c: (lower[c], c)) if self.searches.get(c) is not None]
            reached = set(open_[:raised])
            ranked = [c for c in ranked if c in reached] + [c for c in ranked if c not in reached]
            for c in ranked[:POLISHED]:
                if lower[c] >= best or phase.out_of_time() or isinstance(self.searches[c], RuledOut):
                    continue
                for found in self._plans(c, incumbents.get(c), phase):
                    if found is not None and (c not in incumbents or found.value < incumbents[c].value):
                        incumbents[c] = found
                        best = min(best, found.value)
            self.release(lower, best)  # a better plan rules out more than the bounds raised so far
            if focus is not None and not focus.out_of_time() and (round_ == 0 or best < before[0] * (1 - KIND_PROGRESS)):
                # Plans first: while the leading candidates' plans improve, the others' bounds wait.
                # Raised towards a plan about to be beaten, they seldom rule a candidate out
                # (formulations/mip.md, "Time").
                continue
            self.raise_bounds(open_[raised:], lower, best, bounds_stop)
            if not open_ or phase.out_of_time():
                break
            # After KIND_ROUNDS, more rounds only under a time limit and only while they pay: the
            # best plan or the weakest open bound moved by more than KIND_PROGRESS of the best.
            weakest = min([lower[c] for c in open_ if lower[c] < best], default=np.inf)
            moved = before[0] - best > KIND_PROGRESS * best or weakest - before[1] > KIND_PROGRESS * best
            if round_ + 1 >= KIND_ROUNDS and (phase.deadline is None or not moved):
                break
        return best

    def raise_bounds(self, cands, lower: dict, best: float, clock: Clock) -> None:
        """The bounds of ``cands`` in ``lower`` raised in turn until ``clock`` runs out: a candidate's first
        time its quick try (:meth:`quick_bound`), then a round (KIND_SWEEPS DP paths) of the kind bound."""
        for c in cands:
            if clock.out_of_time() or lower[c] >= best:
                continue
            if c not in self.searches:
                lower[c] = self.quick_bound(c, lower[c], best, clock)
            elif self.searches[c] is not None:
                lower[c] = max(lower[c], self.raise_bound(c, best, KIND_SWEEPS, clock))
            if lower[c] >= best and isinstance(self.searches[c], KindSearch):
                # Ruled out: its tables (megabytes on 1024 GPUs, hundreds of candidates) are let go.
                self.searches[c] = RuledOut(lower[c])

    def release(self, lower: dict, best: float) -> None:
        """Let go of the kind searches of every candidate bounded at ``best`` or above, the best plan
        so far, as :meth:`raise_bounds` does for those it raises: those that a better plan, found
        since their bound was raised, rules out keep their tables too otherwise (megabytes each on
        1024 GPUs, for hundreds of candidates: most of a solve's peak memory).  Nothing uses them
        again: the best plan only gets better (:class:`RuledOut`), and each later use of a kind
        search is for a candidate bounded below it.  With ``top_k`` K > 1 a candidate must beat the
        K-th best plan (the MIP's phase 2), which may lie above the best: then only those bounded
        at the cutoff are let go."""
        if self.search.options.top_k > 1:
            best = self.search.options.cutoff
        for c, search in self.searches.items():
            if isinstance(search, KindSearch) and lower.get(c, -np.inf) >= best:
                self.searches[c] = RuledOut(lower[c])

    def _plans(self, c, inc, clock: Clock) -> list:
        """Plans built from the weakest cells' relaxed paths (eq. K6), and the incumbent's kinds
        re-laid out at their thresholds and its own."""
        model, cells = self.searches[c].model, self.searches[c].promising(POLISH_CELLS)
        left = clock.remaining()
        work = POLISH_WORK if left is None else self.pace.rate() * 0.25 * left
        seconds = 5.0 if left is None else 0.1 * left
        found = [construct(model, [x for x in cells if (c, x.path) not in self.tried], work / 2, seconds, self.pace)]
        self.tried.update((c, x.path) for x in cells)
        if inc is not None:
            ev = self.search.evaluate(inc.plan)
            pairs = [(max(s.compute for s in ev.stages), max(s.allreduce for s in ev.stages))]
            pairs += [(x.T_hi, x.U_hi) for x in cells]
            pairs = [x for x in dict.fromkeys(pairs) if (c, inc.boundaries, x) not in self.tried]
            self.tried.update((c, inc.boundaries, x) for x in pairs)
            found.append(polish(model, inc.stages, pairs, work / 2, self.pace))
        return found
