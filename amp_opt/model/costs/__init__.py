"""Cost models: strategies that price a plan's stages, behind one protocol (:class:`CostModel`).

``hetero`` (the default, ``formulations/hetero.md``) and ``amp`` (AMP's reference
model, ``formulations/amp.md``).  A new cost model subclasses :class:`CostModel` and
:class:`StageCosts` and is listed in :data:`COST_MODELS`; everything else (the
evaluator, the exact search, the MIPs) reads its numbers through the protocol.
"""

from __future__ import annotations

from ...errors import InputError
from .amp import AMP
from .hetero import HETERO, HETERO_CLOSED
from .link_rules import allreduce_factor, hetero_link
from .iteration import iteration_time
from .contract import CostModel, plan_of
from .stage_costs import StageCosts
from .terms import CandidateTerms

COST_MODELS: dict[str, CostModel] = {model.name: model for model in (HETERO, AMP, HETERO_CLOSED)}


def cost_model(model: str | CostModel, field: str = "--cost-model") -> CostModel:
    """The cost model of a name (or the model itself); InputError naming ``field`` if unknown.

    Examples
    --------
    >>> cost_model("amp").enforces_memory
    False
    """
    if isinstance(model, CostModel):
        return model
    if model not in COST_MODELS:
        raise InputError(field, f"unknown cost model {model!r} (choose from {', '.join(COST_MODELS)})")
    return COST_MODELS[model]


__all__ = ["AMP", "HETERO", "HETERO_CLOSED", "COST_MODELS", "CostModel", "StageCosts", "CandidateTerms", "cost_model", "iteration_time",
           "hetero_link", "allreduce_factor", "plan_of"]
