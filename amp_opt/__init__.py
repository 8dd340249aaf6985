"""amp_opt: fast, exact model-parallel training plans for heterogeneous GPU clusters.

Library use::

    import amp_opt
    instance = amp_opt.load_instance("instances/amp_het_cluster.json")
    result = amp_opt.solve(instance, cost_model="amp")
    print(result.best.predicted_time, result.best.plan.to_json())
    amp_opt.evaluate(instance, result.best.plan, cost_model="hetero")

A plug-in solver is a function ``solve_fn(instance, options) -> SolveResult`` registered
with ``amp_opt.register_solver(name, solve_fn)``; ``solve(..., solver=name)`` and
``bench --plugin MODULE`` then run it, and its plans are re-scored by the evaluator.

The package has four wings: :mod:`amp_opt.model` (instances, plans and the cost
models), :mod:`amp_opt.search` (the solvers), :mod:`amp_opt.export` (plans to
launchers) and :mod:`amp_opt.commands` (the CLI), with :mod:`amp_opt.bench` beside
them.  The names below are imported on first use, so ``import amp_opt`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "load_instance": "model.load",
    "parse_instance": "model.load",
    "Instance": "model.instance",
    "Layer": "model.instance",
    "Node": "model.instance",
    "DeviceType": "model.instance",
    "Plan": "model.plan",
    "Pipelines": "model.plan_pipelines",
    "parse_plan": "model.plan",
    "evaluate": "model.evaluate",
    "Evaluation": "model.evaluate",
    "StageReport": "model.evaluate",
    "solve": "search.solve",
    "SolveResult": "search.result",
    "SolverStats": "search.result",
    "SolveOptions": "search.options",
    "register_solver": "search.registry",
    "result_from_plans": "search.registry",
    "InputError": "errors",
    "InfeasibleError": "errors",
    "NoPlanFound": "errors",
    "AmpOptError": "errors",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from .errors import AmpOptError, InfeasibleError, InputError, NoPlanFound
    from .model.evaluate import Evaluation, StageReport, evaluate
    from .model.instance import DeviceType, Instance, Layer, Node
    from .model.load import load_instance, parse_instance
    from .model.plan import Plan, parse_plan
    from .model.plan_pipelines import Pipelines
    from .search.options import SolveOptions
    from .search.registry import register_solver, result_from_plans
    from .search.result import SolveResult, SolverStats
    from .search.solve import solve


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
