"""Placements: which devices form which tensor-parallel group of which stage.

``rank-order`` is the Megatron/DeepSpeed layout AMP assumes.  ``free`` lets
the search choose how many groups each node gives each stage (see
:mod:`amp_opt.search.free_grouping`).  A cost model lists the placements it prices.
"""

from __future__ import annotations

from ..errors import InputError

PLACEMENTS = ("free", "rank-order")


def check_placement(name: str | None, model) -> str:
    """The placement to search: ``name``, or the cost model's default when None."""
    if name is None:
        return model.placements[0]
    if name not in PLACEMENTS:
        raise InputError("--placement", f"unknown placement {name!r} (choose from {', '.join(PLACEMENTS)})")
    if name not in model.placements:
        raise InputError("--placement", f"the {model.name} cost model prices {' or '.join(model.placements)} only; "
                                        f"use --placement {model.placements[0]} or --cost-model hetero")
    return name
