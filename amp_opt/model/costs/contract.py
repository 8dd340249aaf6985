"""The protocol of a cost model (:class:`CostModel`) and who prices what.

A cost model names its schedule and placements and prices candidates through one source of
per-candidate terms, ``candidate_terms`` (``formulations/hetero.md``, "One source of terms");
:func:`rows_price`, :func:`library_priced` and :func:`bound_holds` say which searches and bounds
hold for a caller's model that overrides other methods.
"""

from __future__ import annotations

import numpy as np

from ...errors import InputError
from ..plan import Candidate, Stages
from .iteration import Pipeline, pipeline_weights
from .stage_costs import StageCosts
from .terms import CandidateTerms, stage_order

def plan_of(model, tables, cand: Candidate, partition, stages: Stages, *, chunks=None):
    """The plan of a candidate at a partition and device groups.  A ``per_stage`` candidate's
    plan lists each stage's faster recomputation mode that fits (:meth:`StageCosts.modes_of`),
    the choice every search makes for it."""
    if not cand.per_stage:
        return cand.plan(partition, stages)
    boundaries = tuple(partition) if chunks is None else stage_order(chunks, cand.pp)[1]
    return cand.plan(partition, stages, modes=model.stage_costs(tables, cand, stages, chunks=chunks).modes_of(boundaries))


class CostModel:
    """The protocol of a cost model (a strategy): its name, whether it enforces memory, the
    placements it can price, the candidates it can price, its stage terms and its bound.

    ``schedule`` names the iteration-time formula (:func:`pipeline_weights`);
    ``placements`` lists the placements the model prices, the default first; ``idle`` says
    whether the model prices a plan by the devices it uses alone, so that some may stay idle.
    ``prices(cand)`` says whether the model prices a candidate's decisions.
    ``candidate_terms(tables, cand, chunks=..., modes=...)`` returns the :class:`CandidateTerms`
    of a candidate: the one source of per-candidate terms (module doc) that the model's stage
    terms, its bound and every row-based search read; a caller's model changes its pricing by
    overriding it.  ``stage_costs(tables, cand, stages, chunks=..., modes=...)`` returns the
    :class:`StageCosts` of a candidate on a placement, built from ``candidate_terms``; ``lower_bound(tables, cand,
    labelled=..., enough=...)`` a time no plan of the candidate beats (``inf`` when none
    fits).  A cheap ``labelled=False`` bound is enough for callers that refine it
    themselves; ``enough`` (default inf) says that any bound at or above it will do, so a
    model may stop there.
    """

    name: str = ""
    description: str = ""
    enforces_memory: bool = True
    schedule: str = "closed"  # the iteration-time formula: "closed" (H6, H11) or "1f1b" (H13)
    placements: tuple[str, ...] = ()
    idle: bool = True  # whether a plan's price depends only on the devices it uses (so some may idle)

    def prices(self, cand: Candidate) -> bool:  # pragma: no cover
        raise NotImplementedError

    def candidate_terms(self, tables, cand: Candidate, *, chunks=None, modes=None) -> CandidateTerms:
        """The candidate's terms whatever its devices, read by every path (the contract above)."""
        return CandidateTerms(tables, cand, chunks=chunks, modes=modes)

    def stage_costs(self, tables, cand, stages: Stages, *, chunks=None, modes=None) -> StageCosts:  # pragma: no cover
        raise NotImplementedError

    def lower_bound(self, tables, cand, *, labelled: bool = True, enough: float = np.inf) -> float:  # pragma: no cover
        raise NotImplementedError

    def pipeline(self, tables, cand: Candidate) -> Pipeline:
        """The weights of a candidate's iteration time under this model's schedule."""
        return pipeline_weights(cand.n_micro(tables.instance), cand.pp, cand.virtual_stages, self.schedule)

    def __repr__(self) -> str:
        return f"<cost model {self.name}>"


PRICING = ("candidate_terms", "stage_costs", "lower_bound")  # the methods a cost model prices with


def _callers(model) -> set[str]:
    """Which of :data:`PRICING` a model takes from a class of the caller's (not amp_opt's own)."""
    out = set()
    for name in PRICING:
        owner = next((k for k in type(model).__mro__ if name in vars(k)), CostModel)
        if not owner.__module__.startswith("amp_opt."):
            out.add(name)
    return out


def rows_price(model) -> bool:
    """Whether the row-based searches (the MIP rows, the stage-kind search) price plans as the
    model does: its ``stage_costs`` and ``lower_bound`` are amp_opt's own, built from its
    ``candidate_terms`` (which may be the caller's), the one source the rows read.

    Examples
    --------
    >>> from amp_opt.model.costs.hetero import HETERO, HeteroModel
    >>> class Mine(HeteroModel):
    ...     def stage_costs(self, tables, cand, stages, *, chunks=None, modes=None):
    ...         return super().stage_costs(tables, cand, stages, chunks=chunks, modes=modes)
    >>> Mine.__module__ = "my_planner"  # as if written in the caller's own module
    >>> rows_price(HETERO), rows_price(Mine("mine", "1f1b", "a caller's own"))
    (True, False)
    """
    return not _callers(model) & {"stage_costs", "lower_bound"}


def library_priced(model) -> bool:
    """Whether the model prices with amp_opt's own methods only, so that the bounds computed from
    the layer tables without the model (the throughput bound B6, the block search's layer bound)
    hold under it."""
    return not _callers(model)


def bound_holds(model) -> bool:
    """Whether the model's ``lower_bound`` bounds its ``stage_costs``: both amp_opt's, or the
    bound the caller's own (the caller vouches for it).  A model that overrides ``stage_costs``
    alone keeps amp_opt's bound, which prices other terms: the searches then bound nothing."""
    callers = _callers(model)
    return "stage_costs" not in callers or "lower_bound" in callers


def check_rows_price(model, solver: str) -> None:
    """InputError naming ``cost_model`` when a row-based solver would price other terms than the
    model's (:func:`rows_price`): the MIP could then say OPTIMAL of a plan that is not."""
    if not rows_price(model):
        raise InputError("cost_model", f"{model.name or type(model).__name__} overrides stage_costs or lower_bound, "
                                       f"which {solver} cannot price (its rows read candidate_terms): override "
                                       "candidate_terms instead, or use --solver enumerate")
