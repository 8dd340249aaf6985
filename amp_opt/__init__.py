"""amp_opt: fast, exact model-parallel training plans for heterogeneous GPU clusters.

Library use::

    import amp_opt
    instance = amp_opt.load_instance("instances/amp_het_cluster.json")
    result = amp_opt.solve(instance, cost_model="amp")
    print(result.best.predicted_time, result.best.plan.to_json())
    amp_opt.evaluate(instance, result.best.plan, cost_model="hetero")

The names below are imported on first use, so ``import amp_opt`` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_EXPORTS = {
    "load_instance": "instance",
    "parse_instance": "instance",
    "Instance": "instance",
    "Layer": "instance",
    "Node": "instance",
    "DeviceType": "instance",
    "Plan": "plan",
    "parse_plan": "plan",
    "evaluate": "cost",
    "Evaluation": "cost",
    "StageReport": "cost",
    "solve": "solver",
    "SolveResult": "result",
    "SolverStats": "result",
    "InputError": "errors",
    "InfeasibleError": "errors",
    "AmpOptError": "errors",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from .cost import Evaluation, StageReport, evaluate
    from .errors import AmpOptError, InfeasibleError, InputError
    from .instance import DeviceType, Instance, Layer, Node, load_instance, parse_instance
    from .plan import Plan, parse_plan
    from .result import SolveResult, SolverStats
    from .solver import solve


def __getattr__(name: str):
    if name in _EXPORTS:
        module = importlib.import_module(f".{_EXPORTS[name]}", __name__)
        value = getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'amp_opt' has no attribute {name!r}")
