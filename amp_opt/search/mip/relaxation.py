"""The root LP bound of a candidate's program, for either layer formulation.

:func:`lp_bound` builds the program the MIP driver would solve for a candidate (free
grouping or a fixed rank-order placement, prefix or assignment layers) and solves its
linear relaxation with HiGHS: every variable continuous, no cutoff, no hint.  It is what
``benchmarks/lp_bounds.py`` compares between the two formulations on the same candidates.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...model.plan import Candidate, rank_order_stages
from ..context import Search
from ..options import solve_options
from .formulation import build
from .highs import solve_lp


@dataclass(frozen=True)
class RootLP:
    layers: str
    bound: float | None  # seconds; None if HiGHS did not solve the relaxation
    variables: int
    constraints: int


def lp_bound(instance, cand: Candidate, *, layers: str = "prefix", cost_model: str = "hetero",
             placement: str | None = None, stages=None, symmetry: bool = True,
             time_limit: float | None = 60.0) -> RootLP:
    """The optimum of the linear relaxation of ``cand``'s program (seconds), with its size.

    ``stages`` fixes the device groups (the program then has the layer part and the time rows
    only); otherwise the placement decides: free grouping, or rank order.
    """
    options = dataclasses.replace(solve_options(solver="highs", cost_model=cost_model, placement=placement),
                                  layers=layers, symmetry=symmetry)
    search = Search(instance, options)
    fixed = stages if stages is not None else (
        None if options.placement == "free" else rank_order_stages(cand.tp, cand.dp, cand.pp))
    form = build(search, cand, fixed)
    scale = search.lower_bound(cand)
    scale = scale if 0 < scale < float("inf") else 1.0
    size = form.model.size
    return RootLP(layers, solve_lp(form.model, scale, time_limit), size["variables"], size["constraints"])
