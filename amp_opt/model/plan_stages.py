"""The per-stage fields of a plan (``docs/hetero-plans.md``): tp and dp per stage, the batch shares.

``tp`` and ``dp`` are an int (every stage) or a list of ``pp`` ints; ``shares[s][r]`` is the
samples of each pipeline micro-batch that data-parallel replica r of stage s processes, every
stage's shares summing to the same M.  These functions read and check those fields; the plan
record (:mod:`.plan`) holds them.  Pure functions on plain data: no import of the record.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..errors import InputError
from .engines import engine_of
from .fields import whole_number


def parse_degrees(data: Mapping, key: str, pp: int, where: str) -> int | tuple[int, ...]:
    """``tp`` or ``dp``: one positive int, or a list of ``pp`` of them (one per stage).

    Examples
    --------
    >>> parse_degrees({"tp": [1, 2]}, "tp", 2, "plan")
    (1, 2)
    >>> parse_degrees({"tp": [1, 2]}, "tp", 3, "plan")
    Traceback (most recent call last):
    ...
    amp_opt.errors.InputError: plan.tp: lists 2 degrees, pp is 3
    """
    value = data.get(key)
    if value is None:
        raise InputError(f"{where}.{key}", "is required")
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != pp:
            raise InputError(f"{where}.{key}", f"lists {len(value)} degrees, pp is {pp}")
        return tuple(whole_number(x, f"{where}.{key}[{s}]") for s, x in enumerate(value))
    return whole_number(value, f"{where}.{key}")


def _dp_at(dp, s: int) -> int:
    return dp if isinstance(dp, int) else dp[s]


def parse_shares(data: Mapping, dp, pp: int, where: str) -> tuple[tuple[int, ...], ...] | None:
    """``shares``: per stage, one positive int per data-parallel replica, every stage summing to
    the same M; None when absent (then dp must be one degree for all stages)."""
    value: Any = data.get("shares")
    at = f"{where}.shares"
    if value is None:
        if not isinstance(dp, int) and len(set(dp)) > 1:
            raise InputError(at, "required when dp differs between stages (each stage's samples per replica)")
        return None
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != pp:
        raise InputError(at, f"must be a list of pp = {pp} lists (samples per replica of each stage)")
    rows = []
    for s, row in enumerate(value):
        if not isinstance(row, Sequence) or isinstance(row, str) or len(row) != _dp_at(dp, s):
            raise InputError(f"{at}[{s}]", f"must list one share per data-parallel replica (dp = {_dp_at(dp, s)})")
        rows.append(tuple(whole_number(b, f"{at}[{s}][{r}]") for r, b in enumerate(row)))
    for s, row in enumerate(rows):
        if sum(row) != sum(rows[0]):
            raise InputError(f"{at}[{s}]", f"sums to {sum(row)}, stage 0's shares to {sum(rows[0])}: every stage "
                                           "processes the same pipeline micro-batch")
    return tuple(rows)


def uneven_field(plan) -> str:
    """The field that makes a plan non-uniform: ``tp``, ``dp`` or ``shares``."""
    if not isinstance(plan.tp, int):
        return "tp"
    return "dp" if not isinstance(plan.dp, int) else "shares"


def check_uneven(instance, plan, where: str) -> None:
    """Check a non-uniform plan against an instance: the engine runs it, it is priced, it fits
    the device count, and its pipeline micro-batch divides the global batch."""
    engine = engine_of(instance)
    if not engine.uneven:
        field = uneven_field(plan)
        raise InputError(f"{where}.{field}", f"{engine.name} runs one tp and dp on every stage and equal shares: "
                                             "search.engine \"amp_opt\" allows per-stage degrees and shares")
    zero = instance.training.zero_stage if plan.zero_stage is None else plan.zero_stage
    for field, bad in (("cp", plan.cp > 1), ("virtual_stages", plan.virtual_stages > 1), ("zero_stage", zero >= 3)):
        if bad:
            raise InputError(f"{where}.{field}", "a plan whose stages or replicas differ is priced without context "
                                                 "parallelism, interleaving or ZeRO-3 (cp 1, virtual_stages 1, "
                                                 "zero_stage at most 2)")
    used = plan.devices
    if used > instance.num_devices:
        raise InputError(where, f"the stages use sum of tp_s*cp*dp_s = {used} devices, the cluster has "
                                f"{instance.num_devices}")
    batch, M = instance.training.global_batch, plan.pipeline_micro_batch
    if batch % M:
        field = "shares" if plan.shares is not None else "micro_batch"
        raise InputError(f"{where}.{field}", f"the pipeline micro-batch of {M} samples does not divide the global "
                                             f"batch {batch}")


def parse_stages(data: Mapping, where: str):
    """``stages``: per stage, per replica, the device ids of its group; None when absent."""
    stages = data.get("stages")
    if stages is None:
        return None
    ok = isinstance(stages, Sequence) and all(
        isinstance(stage, Sequence)
        and all(isinstance(group, Sequence) and all(isinstance(d, int) and not isinstance(d, bool) for d in group)
                for group in stage)
        for stage in stages)
    if not ok:
        raise InputError(f"{where}.stages", "must be a list (stages) of lists (replicas) of lists of device ids")
    return tuple(tuple(tuple(group) for group in stage) for stage in stages)
