"""Placements: which devices form which tensor-parallel group of which stage.

``rank-order`` is the Megatron/DeepSpeed layout AMP assumes.  ``free`` lets
the search choose how many groups each node gives each stage (see
:mod:`amp_opt.grouping`).
"""

from __future__ import annotations

from .errors import InputError

PLACEMENTS = ("free", "rank-order")


def check_placement(name: str, cost_model: str) -> str:
    if name is None:
        return "free" if cost_model == "hetero" else "rank-order"
    if name not in PLACEMENTS:
        raise InputError("--placement", f"unknown placement {name!r} (choose from {', '.join(PLACEMENTS)})")
    if name == "free" and cost_model == "amp":
        raise InputError("--placement", "the amp cost model prices AMP's rank order only; use --placement rank-order "
                                        "or --cost-model hetero")
    return name
