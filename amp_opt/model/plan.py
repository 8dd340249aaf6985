"""Plans: the strategy record, its JSON form, and its validation against an instance.

A plan fixes the tensor (tp), context (cp), data (dp) and pipeline (pp) degrees, the
micro-batch size, how training runs (sequence parallelism, activation recomputation,
the ZeRO stage, virtual pipeline stages per device) and the layer partition.  It may
list the devices of every tensor-parallel group: ``stages[s][r]`` holds the global
device ids of group r = cp_rank + cp * dp_rank of stage s.  Without ``stages`` the
Megatron rank order applies: rank = tp_rank + tp*(cp_rank + cp*(dp_rank + dp*stage)),
device = rank.  With ``virtual_stages`` v > 1 (interleaved 1F1B) the partition has
pp*v + 1 boundaries: chunk j runs on stage j mod pp.  A plan may use fewer devices than
the cluster has (tp*cp*dp*pp at most the device count); the others stay idle.

Stages may differ (``docs/hetero-plans.md``): ``tp`` and ``dp`` may list one degree per
stage, and ``shares[s][r]`` gives the samples of each pipeline micro-batch that replica r of
stage s processes.  A plan whose stages and replicas agree is normalised to the uniform form
(int tp and dp, no shares), so every uniform plan has one record.  The per-stage fields are
read and checked in :mod:`.plan_stages`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from ..errors import InputError
from .engines import engine_of
from .fields import number_field, whole_number
from .plan_pipelines import Pipelines, check_pipelines, parse_pipelines
from .plan_stages import check_uneven, parse_degrees, parse_shares, parse_stages

Stages = tuple[tuple[tuple[int, ...], ...], ...]
RECOMPUTE = ("none", "selective", "full")
PLAN_KEYS = ("tp", "dp", "pp", "micro_batch", "partition", "stages", "cp", "sequence_parallel", "recompute",
             "recompute_layers", "zero_stage", "virtual_stages", "shares")
Degrees = "int | tuple[int, ...]"
Shares = tuple[tuple[int, ...], ...]


@dataclass(frozen=True, order=True)
class Candidate:
    """The degrees and training settings of a plan, one point of the outer search space.

    ``recompute_layers`` (with ``recompute == "full"``): how many transformer layers of
    each stage recompute, the first ones (Megatron's block method); 0 means all of them.
    ``per_stage`` (with ``recompute == "full"``, on engines that allow it): each stage
    recomputes in full or not at all, the search choosing per stage (its plans list the modes).
    ``chunks`` (with ``virtual_stages`` > 1): the layer chunks the candidate's plans use, which
    the search does not move (each chunking of a small model is a candidate of its own).
    """

    tp: int
    dp: int
    pp: int
    micro_batch: int
    cp: int = 1
    sequence_parallel: bool = False
    recompute: str = "none"
    recompute_layers: int = 0
    zero_stage: int = 0
    virtual_stages: int = 1
    per_stage: bool = False
    chunks: tuple[int, ...] | None = None  # with virtual stages: the partition (None: the engine's even split)
    batch: int = 0  # the pipeline micro-batch M when it is not dp*micro_batch (one replica of a non-uniform plan)

    @property
    def replicas(self) -> int:
        """Tensor-parallel groups per stage: dp * cp (every one holds the stage's weights)."""
        return self.dp * self.cp

    @property
    def devices(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    def n_micro(self, instance) -> int:
        """Micro-batches per iteration and replica: global batch / M, M = dp * micro-batch (or ``batch``)."""
        return instance.training.global_batch // (self.batch or self.dp * self.micro_batch)

    def plan(self, partition, stages: Stages | None = None, *, modes: tuple[str, ...] | None = None) -> "Plan":
        """The plan of this candidate with a layer partition and, optionally, its device groups and
        (``per_stage``) each stage's recomputation mode; one mode when they agree."""
        recompute: str | tuple[str, ...] = self.recompute
        if modes is not None:
            recompute = modes[0] if len(set(modes)) == 1 else tuple(modes)
        return Plan(self.tp, self.dp, self.pp, self.micro_batch, tuple(partition), stages, cp=self.cp,
                    sequence_parallel=self.sequence_parallel, recompute=recompute,
                    recompute_layers=self.recompute_layers or None, zero_stage=self.zero_stage,
                    virtual_stages=self.virtual_stages)


@dataclass(frozen=True)
class Plan:
    """A plan; see the module docstring.  ``recompute`` may list one mode per stage;
    ``zero_stage`` None means the instance's ``training.zero_stage`` (plans written before
    these fields existed keep their meaning).  ``tp`` and ``dp`` may be tuples (one per stage)
    and ``shares`` lists each stage's samples per replica; ``micro_batch`` is then the largest
    share.  A plan whose stages and replicas agree is normalised to ints and no shares."""

    tp: int | tuple[int, ...]
    dp: int | tuple[int, ...]
    pp: int
    micro_batch: int
    partition: tuple[int, ...]
    stages: Stages | None = None
    cp: int = 1
    sequence_parallel: bool = False
    recompute: str | tuple[str, ...] = "none"
    recompute_layers: int | None = None
    zero_stage: int | None = None
    virtual_stages: int = 1
    shares: Shares | None = None

    def __post_init__(self):
        tp, dp, shares = self.tp, self.dp, self.shares
        if isinstance(tp, tuple) and len(set(tp)) == 1:
            tp = tp[0]
        if isinstance(dp, tuple) and len(set(dp)) == 1:
            dp = dp[0]
        if shares is not None and isinstance(dp, int) and len({b for row in shares for b in row}) == 1:
            object.__setattr__(self, "micro_batch", shares[0][0])
            shares = None
        object.__setattr__(self, "tp", tp)
        object.__setattr__(self, "dp", dp)
        object.__setattr__(self, "shares", shares)

    @property
    def uniform(self) -> bool:
        """One tp, one dp and every replica the same share: a plan of today's form."""
        return isinstance(self.tp, int) and isinstance(self.dp, int) and self.shares is None

    def tp_at(self, s: int) -> int:
        """Stage s's tensor-parallel degree."""
        return self.tp if isinstance(self.tp, int) else self.tp[s]

    def dp_at(self, s: int) -> int:
        """Stage s's data-parallel degree."""
        return self.dp if isinstance(self.dp, int) else self.dp[s]

    def shares_at(self, s: int) -> tuple[int, ...]:
        """Samples of each pipeline micro-batch per data-parallel replica of stage s."""
        return self.shares[s] if self.shares is not None else (self.micro_batch,) * self.dp_at(s)

    @property
    def pipeline_micro_batch(self) -> int:
        """M: the samples of one pipeline micro-batch (every stage's shares sum to it)."""
        return sum(self.shares_at(0))

    @property
    def devices(self) -> int:
        """Devices the plan uses: sum over stages of tp_s * cp * dp_s."""
        return sum(self.tp_at(s) * self.cp * self.dp_at(s) for s in range(self.pp))

    def stage_candidate(self, s: int, share: int | None = None) -> Candidate:
        """The uniform candidate one replica of stage s runs as: (tp_s, dp_s, micro-batch = its
        share) in a pipeline of M samples per micro-batch; the cost terms price it."""
        share = self.micro_batch if share is None else share
        M, dp = self.pipeline_micro_batch, self.dp_at(s)
        return Candidate(self.tp_at(s), dp, self.pp, share, self.cp, self.sequence_parallel,
                         self.recompute_of(s), self.recompute_layers or 0, self.zero_stage or 0, self.virtual_stages,
                         batch=0 if M == dp * share else M)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tp": _degree_json(self.tp), "dp": _degree_json(self.dp), "pp": self.pp,
                               "micro_batch": self.micro_batch, "partition": list(self.partition)}
        if self.shares is not None:
            out["shares"] = [list(row) for row in self.shares]
        if self.stages is not None:
            out["stages"] = [[list(group) for group in stage] for stage in self.stages]
        out.update(cp=self.cp, sequence_parallel=self.sequence_parallel,
                   recompute=self.recompute if isinstance(self.recompute, str) else list(self.recompute))
        if self.recompute_layers is not None:
            out["recompute_layers"] = self.recompute_layers
        if self.zero_stage is not None:
            out["zero_stage"] = self.zero_stage
        out["virtual_stages"] = self.virtual_stages
        return out

    @property
    def candidate(self) -> Candidate:
        """The plan's candidate (a per-stage recompute list becomes the most recomputing mode);
        InputError on a non-uniform plan, whose degrees are per stage (:meth:`stage_candidate`)."""
        if not self.uniform:
            raise InputError("plan", "has per-stage tp/dp or uneven shares: it has no single candidate "
                                     "(ask per stage: tp_at, dp_at, shares_at)")
        modes = (self.recompute,) if isinstance(self.recompute, str) else self.recompute
        return Candidate(self.tp, self.dp, self.pp, self.micro_batch, self.cp, self.sequence_parallel,
                         max(modes, key=RECOMPUTE.index), self.recompute_layers or 0, self.zero_stage or 0,
                         self.virtual_stages)

    def recompute_of(self, s: int) -> str:
        """Stage s's recomputation mode."""
        return self.recompute if isinstance(self.recompute, str) else self.recompute[s]

    def chunks(self, s: int) -> list[tuple[int, int]]:
        """Stage s's layer ranges [k, l): one, or v interleaved chunks."""
        p = self.partition
        return [(p[j], p[j + 1]) for j in range(s, len(p) - 1, self.pp)]

    def stage_layers(self, s: int) -> list[int]:
        return [i for k, l in self.chunks(s) for i in range(k, l)]


def devices_of(plan: Plan | Pipelines) -> list[int]:
    """The device ids a checked plan uses (explicit ``stages``), every pipeline's for several.

    Examples
    --------
    >>> devices_of(parse_plan({"tp": 2, "dp": 1, "pp": 1, "micro_batch": 1, "partition": [0, 2],
    ...                        "stages": [[[3, 1]]]}))
    [3, 1]
    """
    return [d for p in (plan.pipelines if isinstance(plan, Pipelines) else (plan,))
            for stage in p.stages for group in stage for d in group]


def one_pipeline(plan: Plan | Pipelines, what: str) -> Plan:
    """``plan`` itself when it is one pipeline; for several, InputError naming ``pipelines`` and
    saying that ``what`` takes one (and where several go).

    Examples
    --------
    >>> one_pipeline(parse_plan({"tp": 1, "dp": 1, "pp": 1, "micro_batch": 1, "partition": [0, 2]}), "Megatron-LM").pp
    1
    """
    if isinstance(plan, Pipelines):
        raise InputError("plan.pipelines", f"{what} takes a plan of one pipeline; a plan of several pipelines is "
                                           "priced by evaluate, explain and plot, executed by run and exported "
                                           "with --format hetu")
    return plan


def _degree_json(value):
    return value if isinstance(value, int) else list(value)


def _degree_text(value) -> str:
    return str(value) if isinstance(value, int) else ",".join(map(str, value))


def describe(plan: Plan | Pipelines) -> str:
    """A plan's degrees and settings in one line, for messages (defaults left out); several
    pipelines are each described, with their micro-batches, between brackets."""
    if isinstance(plan, Pipelines):
        return " ".join(f"[{describe(p)} micro_batches={n}]" for p, n in zip(plan.pipelines, plan.micro_batches))
    parts = [f"tp={_degree_text(plan.tp)}"] + ([f"cp={plan.cp}"] if plan.cp > 1 else []) + [
        f"dp={_degree_text(plan.dp)}", f"pp={plan.pp}", f"micro_batch={plan.micro_batch}"]
    if plan.shares is not None:
        parts.append("shares=" + "/".join(",".join(map(str, row)) for row in plan.shares))
    if plan.virtual_stages > 1:
        parts.append(f"virtual_stages={plan.virtual_stages}")
    if plan.sequence_parallel:
        parts.append("sequence_parallel")
    if plan.recompute != "none":
        modes = plan.recompute if isinstance(plan.recompute, str) else ",".join(plan.recompute)
        parts.append(f"recompute={modes}")
    if plan.recompute_layers:
        parts.append(f"recompute_layers={plan.recompute_layers}")
    if plan.zero_stage:
        parts.append(f"zero_stage={plan.zero_stage}")
    return " ".join(parts)


def partition_text(plan: Plan | Pipelines) -> str:
    """A plan's layer boundaries for messages: ``[0, 2, 4]``, or each pipeline's joined by "and".

    Examples
    --------
    >>> partition_text(parse_plan({"tp": 1, "dp": 1, "pp": 2, "micro_batch": 1, "partition": [0, 2, 4]}))
    '[0, 2, 4]'
    """
    if isinstance(plan, Pipelines):
        return " and ".join(partition_text(p) for p in plan.pipelines)
    return str(list(plan.partition))


def describe_candidate(cand: Candidate) -> str:
    """A candidate's degrees and settings in one line (:func:`describe` of its plans)."""
    text = describe(cand.plan(()))
    return text.replace("recompute=full", "recompute=per-stage") if cand.per_stage else text


def rank_order_stages(tp, dp, pp: int, cp: int = 1) -> Stages:
    """Megatron's placement: rank = tp_rank + tp*(cp_rank + cp*(dp_rank + dp*stage)), device = rank.
    With per-stage degrees (tuples) the devices are dealt in the same order: stage 0's groups
    first, then stage 1's, ..."""
    out, first = [], 0
    for i in range(pp):
        m = tp if isinstance(tp, int) else tp[i]
        groups = (dp if isinstance(dp, int) else dp[i]) * cp
        out.append(tuple(tuple(first + j + m * r for j in range(m)) for r in range(groups)))
        first += m * groups
    return tuple(out)


def _flag(data: Mapping, key: str, where: str, default: bool) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise InputError(f"{where}.{key}", f"must be true or false, got {value!r}")
    return value


def _recompute(data: Mapping, where: str, pp: int):
    value = data.get("recompute", "none")
    modes = [value] if isinstance(value, str) else value
    if not isinstance(modes, Sequence) or not modes or any(m not in RECOMPUTE for m in modes):
        raise InputError(f"{where}.recompute", f"must be one of {', '.join(RECOMPUTE)} or a list with one per stage, "
                                               f"got {value!r}")
    if not isinstance(value, str):
        if len(value) != pp:
            raise InputError(f"{where}.recompute", f"lists {len(value)} modes, pp is {pp}")
        return tuple(value)
    return value


def parse_plan(data: Any, *, where: str = "plan") -> Plan | Pipelines:
    """Check the shape of a plan object (not yet against an instance; see :func:`check_plan`).
    An object with ``pipelines`` is a plan of several pipelines (:mod:`.plan_pipelines`).

    Examples
    --------
    >>> plan = parse_plan({"tp": 1, "dp": 2, "pp": 2, "micro_batch": 4, "partition": [0, 3, 6]})
    >>> plan.candidate.replicas, plan.stage_layers(1)
    (2, [3, 4, 5])
    >>> parse_plan({"tp": 1, "dp": 2, "pp": 2, "micro_batch": 4, "partition": [0, 6]})
    Traceback (most recent call last):
    ...
    amp_opt.errors.InputError: plan.partition: must hold pp*virtual_stages+1 = 3 boundaries, got 2
    """
    if not isinstance(data, Mapping):
        raise InputError(where, f"must be a JSON object, got {type(data).__name__}")
    if "pipelines" in data:
        return parse_pipelines(data, where, parse_plan)
    unknown = sorted(set(data) - set(PLAN_KEYS))
    if unknown:
        hint = ("; this is a result (solve --json, evaluate --json), not a plan: take its \"plan\" member"
                if isinstance(data.get("plan"), Mapping) else "")
        raise InputError(f"{where}.{unknown[0]}", f"unknown field (a plan has {', '.join(PLAN_KEYS)}){hint}")
    for key in ("tp", "dp"):  # named in the order of PLAN_KEYS when missing
        if data.get(key) is None:
            raise InputError(f"{where}.{key}", "is required")
    pp = number_field(data, "pp", where)
    tp, dp = parse_degrees(data, "tp", pp, where), parse_degrees(data, "dp", pp, where)
    shares = parse_shares(data, dp, pp, where)
    if shares is None:
        mb = number_field(data, "micro_batch", where)
    else:
        mb = max(b for row in shares for b in row)
        if data.get("micro_batch") is not None and number_field(data, "micro_batch", where) != mb:
            raise InputError(f"{where}.micro_batch", f"with shares it must be the largest share {mb}, "
                                                     f"got {data['micro_batch']}")
    cp = number_field(data, "cp", where, default=1)
    v = number_field(data, "virtual_stages", where, default=1)
    partition = _partition(data, pp * v, where)
    recompute = _recompute(data, where, pp)
    layers = data.get("recompute_layers")
    if layers is not None:
        whole_number(layers, f"{where}.recompute_layers")
        if "full" not in ((recompute,) if isinstance(recompute, str) else recompute):
            raise InputError(f"{where}.recompute_layers", "only applies with recompute \"full\"")
    zero = data.get("zero_stage")
    if zero is not None and zero not in (0, 1, 2, 3):
        raise InputError(f"{where}.zero_stage", f"must be 0, 1, 2 or 3, got {zero!r}")
    return Plan(tp, dp, pp, mb, tuple(partition), parse_stages(data, where), cp=cp,
                sequence_parallel=_flag(data, "sequence_parallel", where, False), recompute=recompute,
                recompute_layers=layers, zero_stage=zero, virtual_stages=v, shares=shares)


def _partition(data: Mapping, parts: int, where: str) -> list[int]:
    """The plan's layer boundaries, checked for shape: ``parts`` + 1 integers."""
    partition = data.get("partition")
    if partition is None:
        raise InputError(f"{where}.partition", "required: the layer boundaries of the stages, "
                         "[0, ..., number of layers] (pp*virtual_stages+1 integers)")
    if not isinstance(partition, Sequence) or isinstance(partition, str) or not all(
        isinstance(b, int) and not isinstance(b, bool) for b in partition
    ):
        raise InputError(f"{where}.partition", "must be a list of integers (layer boundaries)")
    if len(partition) != parts + 1:
        raise InputError(f"{where}.partition",
                         f"must hold pp*virtual_stages+1 = {parts + 1} boundaries, got {len(partition)}")
    return partition


def check_plan(instance, plan: Plan | Pipelines, *, where: str = "plan") -> Plan | Pipelines:
    """Validate a plan against an instance; return it with explicit ``stages`` and ``zero_stage``.

    Checks the degrees against the device count, the micro-batch against the global batch,
    the partition against the layer list, that every device is used at most once, and the
    instance's engine's rules.  A tensor-parallel group may span nodes (priced on the
    inter-node links, ``formulations/hetero.md`` H16).  Several pipelines are checked one by one
    (:func:`.plan_pipelines.check_pipelines`).
    """
    if isinstance(plan, Pipelines):
        return check_pipelines(instance, plan, where, check_plan, rank_order_stages)
    n_dev, n_layers = instance.num_devices, instance.num_layers
    if not plan.uniform:
        check_uneven(instance, plan, where)
    elif plan.tp * plan.cp * plan.dp * plan.pp > n_dev:
        raise InputError(where, f"tp*cp*dp*pp = {plan.tp}*{plan.cp}*{plan.dp}*{plan.pp} = "
                                f"{plan.tp * plan.cp * plan.dp * plan.pp}, the cluster has {n_dev} devices")
    batch = instance.training.global_batch
    if plan.uniform and batch % (plan.dp * plan.micro_batch):
        raise InputError(f"{where}.micro_batch",
                         f"dp*micro_batch = {plan.dp * plan.micro_batch} does not divide the global batch {batch}")
    p = plan.partition
    if p[0] != 0 or p[-1] != n_layers:
        raise InputError(f"{where}.partition", f"must start at 0 and end at the layer count {n_layers}, got {list(p)}")
    if any(b >= c for b, c in zip(p, p[1:])):
        raise InputError(f"{where}.partition", f"boundaries must increase strictly (no empty stage), got {list(p)}")
    stages = plan.stages if plan.stages is not None else rank_order_stages(plan.tp, plan.dp, plan.pp, plan.cp)
    _check_stages(instance, plan, stages, where)
    checked = replace(plan, stages=stages,
                      zero_stage=instance.training.zero_stage if plan.zero_stage is None else plan.zero_stage)
    engine_of(instance).check(instance, checked, where=where)
    return checked


def _check_stages(instance, plan: Plan, stages: Stages, where: str) -> None:
    n_dev = instance.num_devices
    if len(stages) != plan.pp:
        raise InputError(f"{where}.stages", f"has {len(stages)} stages, pp is {plan.pp}")
    seen: set[int] = set()
    for s, stage in enumerate(stages):
        groups = plan.dp_at(s) * plan.cp
        if len(stage) != groups:
            raise InputError(f"{where}.stages[{s}]", f"has {len(stage)} tensor-parallel groups, dp*cp is {groups}")
        for r, group in enumerate(stage):
            at = f"{where}.stages[{s}][{r}]"
            if len(group) != plan.tp_at(s):
                raise InputError(at, f"has {len(group)} devices, tp is {plan.tp_at(s)} (every group of a stage "
                                     "has the stage's tp: per-replica tp is not supported yet)")
            for device in group:
                if not 0 <= device < n_dev:
                    raise InputError(at, f"device {device} does not exist (devices are 0..{n_dev - 1})")
                if device in seen:
                    raise InputError(at, f"device {device} is used twice")
                seen.add(device)


def load_plans(data: Any, *, where: str = "plan") -> tuple[list[Plan], bool]:
    """Parse one plan object or a list of them; also say whether it was a list."""
    if isinstance(data, list):
        return [parse_plan(item, where=f"{where}[{i}]") for i, item in enumerate(data)], True
    return [parse_plan(data, where=where)], False
