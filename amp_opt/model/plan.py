"""Plans: the strategy record, its JSON form, and its validation against an instance.

A plan fixes the tensor (tp), data (dp) and pipeline (pp) degrees, the
micro-batch size, the layer partition (pp+1 boundaries) and, optionally, the
devices of every tensor-parallel group: ``stages[s][r]`` lists the global
device ids of replica r of stage s.  Without ``stages`` the Megatron/DeepSpeed
rank order applies: rank = tp_rank + tp*dp_rank + tp*dp*stage, device = rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..errors import InputError
from .fields import number_field

Stages = tuple[tuple[tuple[int, ...], ...], ...]
PLAN_KEYS = ("tp", "dp", "pp", "micro_batch", "partition", "stages")


@dataclass(frozen=True, order=True)
class Candidate:
    """The degrees of a plan, one point of the outer search space (see :mod:`amp_opt.model.candidates`)."""

    tp: int
    dp: int
    pp: int
    micro_batch: int

    def n_micro(self, instance) -> int:
        """Micro-batches per iteration and replica: global batch / (dp * micro-batch)."""
        return instance.training.global_batch // (self.dp * self.micro_batch)

    def plan(self, partition, stages: Stages | None = None) -> "Plan":
        """The plan of these degrees with a layer partition and, optionally, its device groups."""
        return Plan(self.tp, self.dp, self.pp, self.micro_batch, tuple(partition), stages)


@dataclass(frozen=True)
class Plan:
    tp: int
    dp: int
    pp: int
    micro_batch: int
    partition: tuple[int, ...]
    stages: Stages | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "tp": self.tp,
            "dp": self.dp,
            "pp": self.pp,
            "micro_batch": self.micro_batch,
            "partition": list(self.partition),
        }
        if self.stages is not None:
            out["stages"] = [[list(group) for group in stage] for stage in self.stages]
        return out

    @property
    def candidate(self) -> Candidate:
        return Candidate(self.tp, self.dp, self.pp, self.micro_batch)

    def stage_layers(self, s: int) -> range:
        return range(self.partition[s], self.partition[s + 1])


def rank_order_stages(tp: int, dp: int, pp: int) -> Stages:
    """Megatron/DeepSpeed placement: rank = tp_rank + tp*dp_rank + tp*dp*stage."""
    return tuple(
        tuple(tuple(j + tp * k + tp * dp * i for j in range(tp)) for k in range(dp)) for i in range(pp)
    )


def parse_plan(data: Any, *, where: str = "plan") -> Plan:
    """Check the shape of a plan object (not yet against an instance; see :func:`check_plan`).

    Examples
    --------
    >>> plan = parse_plan({"tp": 1, "dp": 2, "pp": 2, "micro_batch": 4, "partition": [0, 3, 6]})
    >>> plan.candidate, plan.stage_layers(1)
    (Candidate(tp=1, dp=2, pp=2, micro_batch=4), range(3, 6))
    >>> parse_plan({"tp": 1, "dp": 2, "pp": 2, "micro_batch": 4, "partition": [0, 6]})
    Traceback (most recent call last):
    ...
    amp_opt.errors.InputError: plan.partition: must hold pp+1 = 3 boundaries, got 2
    """
    if not isinstance(data, Mapping):
        raise InputError(where, f"must be a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - set(PLAN_KEYS))
    if unknown:
        raise InputError(f"{where}.{unknown[0]}", f"unknown field (a plan has {', '.join(PLAN_KEYS)})")
    tp, dp, pp, mb = (number_field(data, key, where) for key in PLAN_KEYS[:4])
    partition = data.get("partition")
    if not isinstance(partition, Sequence) or isinstance(partition, str) or not all(
        isinstance(b, int) and not isinstance(b, bool) for b in partition
    ):
        raise InputError(f"{where}.partition", "must be a list of integers (layer boundaries)")
    if len(partition) != pp + 1:
        raise InputError(f"{where}.partition", f"must hold pp+1 = {pp + 1} boundaries, got {len(partition)}")
    stages = data.get("stages")
    if stages is not None:
        ok = isinstance(stages, Sequence) and all(
            isinstance(stage, Sequence)
            and all(
                isinstance(group, Sequence)
                and all(isinstance(d, int) and not isinstance(d, bool) for d in group)
                for group in stage
            )
            for stage in stages
        )
        if not ok:
            raise InputError(f"{where}.stages", "must be a list (stages) of lists (replicas) of lists of device ids")
        stages = tuple(tuple(tuple(group) for group in stage) for stage in stages)
    return Plan(tp, dp, pp, mb, tuple(partition), stages)


def check_plan(instance, plan: Plan, *, where: str = "plan") -> Plan:
    """Validate a plan against an instance; return it with explicit ``stages``.

    Checks the degrees against the device count, the micro-batch against the
    global batch, the partition against the layer list, and that every device
    is used exactly once with tensor-parallel groups inside one node.
    """
    n_dev, n_layers = instance.num_devices, instance.num_layers
    if plan.tp * plan.dp * plan.pp != n_dev:
        raise InputError(
            where, f"tp*dp*pp = {plan.tp}*{plan.dp}*{plan.pp} = {plan.tp * plan.dp * plan.pp}, the cluster has {n_dev} devices"
        )
    batch = instance.training.global_batch
    if batch % (plan.dp * plan.micro_batch):
        raise InputError(
            f"{where}.micro_batch",
            f"dp*micro_batch = {plan.dp * plan.micro_batch} does not divide the global batch {batch}",
        )
    p = plan.partition
    if p[0] != 0 or p[-1] != n_layers:
        raise InputError(f"{where}.partition", f"must start at 0 and end at the layer count {n_layers}, got {list(p)}")
    if any(b >= c for b, c in zip(p, p[1:])):
        raise InputError(f"{where}.partition", f"boundaries must increase strictly (no empty stage), got {list(p)}")

    stages = plan.stages if plan.stages is not None else rank_order_stages(plan.tp, plan.dp, plan.pp)
    if len(stages) != plan.pp:
        raise InputError(f"{where}.stages", f"has {len(stages)} stages, pp is {plan.pp}")
    seen: set[int] = set()
    for s, stage in enumerate(stages):
        if len(stage) != plan.dp:
            raise InputError(f"{where}.stages[{s}]", f"has {len(stage)} replicas, dp is {plan.dp}")
        for r, group in enumerate(stage):
            at = f"{where}.stages[{s}][{r}]"
            if len(group) != plan.tp:
                raise InputError(at, f"has {len(group)} devices, tp is {plan.tp}")
            for device in group:
                if not 0 <= device < n_dev:
                    raise InputError(at, f"device {device} does not exist (devices are 0..{n_dev - 1})")
                if device in seen:
                    raise InputError(at, f"device {device} is used twice")
                seen.add(device)
            if len({int(instance.device_node[d]) for d in group}) > 1:
                raise InputError(at, f"tensor-parallel group {list(group)} spans several nodes")
    return Plan(plan.tp, plan.dp, plan.pp, plan.micro_batch, plan.partition, stages)


def load_plans(data: Any, *, where: str = "plan") -> tuple[list[Plan], bool]:
    """Parse one plan object or a list of them; also say whether it was a list."""
    if isinstance(data, list):
        return [parse_plan(item, where=f"{where}[{i}]") for i, item in enumerate(data)], True
    return [parse_plan(data, where=where)], False
