"""The options of a solve: one frozen record, declared once and validated once at the boundary.

The fields of :class:`SolveOptions` marked as options (:data:`OPTIONS`, with their defaults)
are what a caller may pass: :func:`solve_options` takes exactly those and checks them, and
:func:`amp_opt.solve` takes them as keyword-only arguments (its signature is made from them).
Everything inside the search trusts a :class:`SolveOptions`.
"""

from __future__ import annotations

import math
import inspect
from dataclasses import MISSING, dataclass, field, fields
from typing import Callable

from ..errors import InputError
from ..model.costs import CostModel, cost_model as get_cost_model
from ..model.costs.contract import check_rows_price
from ..model.fields import whole_number
from ..model.placement import check_placement
from .registry import lookup

OBJECTIVES = ("time", "cost")
BACKENDS = ("auto", "enumerate", "cpsat", "cbc", "highs", "plugin")
ROW_BACKENDS = ("cpsat", "cbc", "highs")  # the backends whose programs read candidate_terms (terms.py)
LAYER_FORMULATIONS = ("prefix", "assignment")
PIPELINES = ("skip", "bound")  # plans of several pipelines: left out, or ruled out by P1 (exactness.md X6)


def option(default, *, given=MISSING, **kwargs):
    """A field that callers pass (``given``: the caller's default when it differs from the
    record's, such as a placement chosen by the cost model)."""
    return field(default=default, metadata={"option": True, "given": default if given is MISSING else given},
                 **kwargs)


@dataclass(frozen=True)
class SolveOptions:
    """What to search and how.

    Attributes
    ----------
    solver : str
        A registered solver name (``amp_opt.search.registry``): a built-in variant such as
        "auto", "enumerate", "cpsat", "cbc", "highs", "cpsat-nokinds", or a plug-in's.
    cost_model : str or CostModel
        The cost model: a name ("hetero", "hetero-closed", "amp") or the object a caller
        passed (a subclass of its own); :attr:`model` is the model itself.
    placement : str
        "free" or "rank-order" (checked against the cost model).
    top_k : int
        How many of the best plans to return: the K best distinct plans
        (``formulations/exactness.md``, "The k best plans").
    per_candidate : bool
        With ``top_k``: each candidate's best plan only, the K best of those (AMP's ranking of
        candidates), rather than the K best plans.
    pipelines : str
        On the engine "amp_opt": "skip" (default) leaves plans of several pipelines out of the
        search, and OPTIMAL says so; "bound" also solves the sub-clusters of every split of the
        devices and batch of a small cluster and, when no split's slowest pipeline can beat the
        plan found, OPTIMAL covers them (``formulations/exactness.md``, X6).
    time_limit : float or None
        Seconds for the whole search.
    seed, workers : int
        For the MIP solvers; fixed so that runs repeat.
    processes : int
        Processes for the search over idle node classes under a time limit: the whole cluster
        is searched in this one and the other subsets of node classes in up to ``processes`` - 1
        forked ones beside it (no more than the usable cores).  1 (default): one after another.
    objective : str
        "time" (seconds per iteration) or "cost" (USD per iteration).
    budget : float or None
        USD per hour the plan's devices may cost at most (with objective time).
    cutoff : float
        Seconds: only plans faster than this are of interest (set by the search over idle
        node classes, which already knows such a plan).
    progress : callable or None
        ``progress(done, total)`` after each candidate.
    backend : str
        The engine the variant runs: "auto", "enumerate", "cpsat", "cbc", "highs" (or "plugin").
    kinds, incumbents, warm_start, cutoffs, symmetry : bool
        The MIP pipeline's ingredients (all on by default; an ablation variant switches one
        off): phase 1b's stage-kind search, phase 1's DP incumbents, the programs' warm
        starts, their cutoffs at the k-th best value, the symmetry rows M12.
    layers : str
        "prefix" (Y[s,l], eq. M1-M4) or "assignment" (x[l,s] with contiguity rows, eq. A1-A4).
    diagnose : bool
        Whether an infeasible verdict names the least overfull plan (a search of its own, until
        the deadline).  The search over idle node classes keeps it for the first subset only,
        whose message is the one shown.
    carry : Carry or None
        What an earlier search of the same instance left (:class:`amp_opt.search.context.Carry`):
        the search over idle node classes passes one per subset, so that a subset run again goes
        on from where its last run stopped.  Not an option for callers.
    """

    solver: str = option("auto")
    cost_model: str | CostModel = option("hetero")
    placement: str = option("free", given=None)
    top_k: int = option(1)
    time_limit: float | None = option(None)
    seed: int = option(0)
    workers: int = option(1)
    objective: str = option("time")
    budget: float | None = option(None)
    cutoff: float = math.inf
    progress: Callable[[int, int], None] | None = option(None, compare=False)
    backend: str = "auto"
    kinds: bool = True
    incumbents: bool = True
    warm_start: bool = True
    cutoffs: bool = True
    symmetry: bool = True
    layers: str = "prefix"
    diagnose: bool = True
    carry: object = field(default=None, compare=False, repr=False)
    processes: int = option(1)
    per_candidate: bool = option(False)
    pipelines: str = option("skip")

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise InputError("backend", f"unknown backend {self.backend!r} (choose from {', '.join(BACKENDS)})")
        if self.layers not in LAYER_FORMULATIONS:
            raise InputError("layers", f"unknown layer formulation {self.layers!r} "
                                       f"(choose from {', '.join(LAYER_FORMULATIONS)})")
        for name in ("kinds", "incumbents", "warm_start", "cutoffs", "symmetry", "diagnose", "per_candidate"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(name, f"must be true or false, got {getattr(self, name)!r}")

    @property
    def model(self) -> CostModel:
        return get_cost_model(self.cost_model)


OPTIONS = {f.name: f.metadata["given"] for f in fields(SolveOptions) if f.metadata.get("option")}
"""What a caller may pass, with the caller's defaults: the keyword-only arguments of
:func:`solve_options` and :func:`amp_opt.solve`."""


def signature(*, before=(), after=()) -> inspect.Signature:
    """A keyword-only signature over :data:`OPTIONS` (for :func:`amp_opt.solve`), with ``before``
    and ``after`` its other parameters."""
    kw = inspect.Parameter.KEYWORD_ONLY
    return inspect.Signature([*before, *(inspect.Parameter(name, kw, default=default) for name, default in OPTIONS.items()),
                              *after])


def solve_options(**given) -> SolveOptions:
    """Check every option once and return the record; InputError names the first bad one.
    Takes the keyword arguments of :data:`OPTIONS` (the others keep the caller's defaults).

    Examples
    --------
    >>> solve_options(cost_model="amp").placement
    'rank-order'
    """
    unknown = sorted(set(given) - set(OPTIONS))
    if unknown:
        raise TypeError(f"unexpected keyword argument {unknown[0]!r} (options: {', '.join(OPTIONS)})")
    o = {**OPTIONS, **given}
    model = get_cost_model(o["cost_model"])
    entry = lookup(o["solver"])  # InputError listing the known names
    for name in ("top_k", "workers", "processes"):
        whole_number(o[name], "--" + name.replace("_", "-"))
    seed, time_limit, objective, budget = o["seed"], o["time_limit"], o["objective"], o["budget"]
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InputError("--seed", f"must be an integer, got {seed!r}")
    if time_limit is not None and (isinstance(time_limit, bool) or not isinstance(time_limit, (int, float))
                                   or not time_limit > 0 or not math.isfinite(time_limit)):
        raise InputError("--time-limit", f"must be positive seconds, got {time_limit!r}")
    if objective not in OBJECTIVES:
        raise InputError("--objective", f"unknown objective {objective!r} (choose from {', '.join(OBJECTIVES)})")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float))
                               or not budget > 0 or not math.isfinite(budget)):
        raise InputError("--budget", f"must be positive USD per hour, got {budget!r}")
    if o["pipelines"] not in PIPELINES:
        raise InputError("--pipelines", f"unknown choice {o['pipelines']!r} (choose from {', '.join(PIPELINES)})")
    if budget is not None and objective == "cost":
        raise InputError("--budget", "applies with --objective time (the cost objective already minimises cost)")
    settings = dict(entry.settings) if entry.builtin else {"backend": "plugin"}
    if settings.get("backend") in ROW_BACKENDS:  # a model the rows cannot price: refused up front
        check_rows_price(model, f"--solver {o['solver']}")
    checked = dict(o, cost_model=o["cost_model"] if isinstance(o["cost_model"], CostModel) else model.name,
                   placement=check_placement(o["placement"], model),
                   time_limit=None if time_limit is None else float(time_limit),
                   budget=None if budget is None else float(budget))
    return SolveOptions(**checked, **settings)
