"""Placements: which devices form which tensor-parallel group of which stage.

``rank-order`` is the Megatron/DeepSpeed layout AMP assumes.  ``free`` lets
the search choose how many groups each node gives each stage (see
:mod:`amp_opt.grouping`).
"""

from __future__ import annotations

from .errors import InputError
from .plan import rank_order_stages

PLACEMENTS = ("free", "rank-order")


def check_placement(name: str, cost_model: str) -> str:
    if name is None:
        return "free" if cost_model == "hetero" else "rank-order"
    if name not in PLACEMENTS:
        raise InputError("--placement", f"unknown placement {name!r} (choose from {', '.join(PLACEMENTS)})")
    return name


def placements(instance, cand, placement: str):
    """The placements to try for a candidate."""
    if placement == "rank-order":
        yield rank_order_stages(cand.tp, cand.dp, cand.pp)
    else:
        from .grouping import free_placements

        yield from free_placements(instance, cand)
