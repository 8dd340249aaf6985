"""Training engines and their rules: which decisions a plan may take and still run.

The search never proposes a candidate an engine cannot run, and a given plan that breaks
a rule is rejected with one line naming the field and the rule (``check``).  Sources:
Megatron-LM (``megatron/training/arguments.py``, ``megatron/core/pipeline_parallel/
schedules.py``: the interleaved schedule needs micro-batches divisible by pp; sequence
parallelism is dropped when tp is 1; context parallelism needs seq_len divisible by 2*cp;
ZeRO-2/3 through Megatron-FSDP, which amp_opt plans without pipeline parallelism, as
Torch-FSDP2 requires and Megatron-FSDP's documentation does not promise otherwise) and DeepSpeed (``PipelineModule``: no interleaved schedule, ZeRO
stages 2 and 3 only without pipeline parallelism, activation checkpointing of whole
layers, which each stage's own layer code may apply or not).  ``amp_opt`` (amp_opt's own
runtime) keeps Megatron's rules, lets each stage recompute in full or not at all (as DeepSpeed),
and alone runs plans whose stages and replicas differ.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError

PER_STAGE_MODES = ("none", "full")  # what each stage chooses between where stages recompute differently, fastest first


@dataclass(frozen=True)
class Engine:
    """What one training engine can run."""

    name: str
    interleaving: bool  # virtual pipeline stages (interleaved 1F1B)
    context_parallel: bool
    sequence_parallel: bool  # Megatron-style sequence parallelism (with tp > 1)
    selective_recompute: bool
    per_stage_recompute: bool  # stages may recompute differently
    block_recompute: bool  # full recomputation of only each stage's first r layers (Megatron's block method)
    sharded_zero_with_pipeline: int  # the largest ZeRO stage allowed together with pp > 1
    uneven: bool = False  # per-stage tp and dp, replicas on different types, uneven batch shares (docs/hetero-plans.md)

    def rule(self, instance, cand) -> tuple[str, str] | None:
        """(field, rule) of the first rule the candidate breaks, or None when the engine can run it."""
        n_micro = cand.n_micro(instance)
        if cand.sequence_parallel and not self.sequence_parallel:
            return "sequence_parallel", f"{self.name} has no Megatron-style sequence parallelism"
        if cand.sequence_parallel and cand.tp == 1:
            return "sequence_parallel", "sequence parallelism splits the tensor-parallel group's activations: needs tp > 1"
        if cand.cp > 1 and not self.context_parallel:
            return "cp", f"{self.name} has no context parallelism"
        tokens = instance.training.tokens_per_sample
        if cand.cp > 1 and tokens is not None and tokens % (2 * cand.cp):
            return "cp", (f"context parallelism splits each sequence into 2*cp load-balanced chunks: seq_len {tokens} "
                          f"is not divisible by {2 * cand.cp}")
        if cand.cp > 1 and not instance.layer_facts["kv"]:
            return "cp", "context parallelism needs the model's keys and values (kv_bytes; a preset model has them)"
        if cand.virtual_stages > 1:
            if not self.interleaving:
                return "virtual_stages", f"{self.name} has no interleaved pipeline schedule"
            if cand.pp < 2:
                return "virtual_stages", "the interleaved schedule needs pp >= 2"
            parts = cand.pp * cand.virtual_stages
            if megatron_split(instance, parts) is None or not _splits_members(instance, parts):
                body = instance.transformer_span
                return "virtual_stages", (f"the interleaved schedule splits the {body[1] - body[0]} transformer layers "
                                          f"evenly over pp*virtual_stages = {parts} chunks (counting the embedding and "
                                          "the loss as one layer each, or not): they must divide")
            if n_micro % cand.pp:
                return "virtual_stages", (f"the interleaved schedule needs micro-batches per iteration ({n_micro}) "
                                          f"divisible by pp ({cand.pp})")
        if cand.recompute == "selective" and not self.selective_recompute:
            return "recompute", f"{self.name} recomputes whole layers only (no selective recomputation)"
        if cand.per_stage and not self.per_stage_recompute:
            return "recompute", f"{self.name} recomputes the same way on every stage"
        if cand.recompute_layers and not self.block_recompute:
            return "recompute_layers", f"{self.name} recomputes all layers of a stage or none (no block method)"
        if cand.recompute_layers and cand.virtual_stages > 1:
            return "recompute_layers", ("the block method with interleaving recomputes the first layers of every "
                                        "virtual stage's chunk, which amp_opt does not price: use virtual_stages 1")
        if cand.zero_stage > self.sharded_zero_with_pipeline and cand.pp > 1:
            return "zero_stage", (f"{self.name} runs ZeRO stage {cand.zero_stage} only without pipeline parallelism "
                                  f"(pp = 1); with pp > 1 at most stage {self.sharded_zero_with_pipeline}")
        return None

    def check(self, instance, plan, *, where: str = "plan") -> None:
        """Raise InputError naming the field and the rule a checked plan breaks."""
        if not isinstance(plan.recompute, str) and not self.per_stage_recompute:
            raise InputError(f"{where}.recompute", f"{self.name} recomputes the same way on every stage: "
                                                   "give one mode, not a list")
        if not isinstance(plan.recompute, str) and "selective" in plan.recompute and not self.selective_recompute:
            # the rule below sees the candidate's most recomputing mode only, which hides a selective stage
            raise InputError(f"{where}.recompute", f"{self.name} recomputes whole layers only (no selective "
                                                   f"recomputation), got {list(plan.recompute)}")
        if not isinstance(plan.recompute, str):
            _check_per_stage(plan, where)
        # a non-uniform plan (only on an engine that runs it, :func:`.plan_stages.check_uneven`)
        # keeps every rule on each stage's own degrees, at its largest share
        cands = [plan.candidate] if plan.uniform else [plan.stage_candidate(s, max(plan.shares_at(s)))
                                                       for s in range(plan.pp)]
        for cand in cands:
            broken = self.rule(instance, cand)
            if broken is not None:
                raise InputError(f"{where}.{broken[0]}", f"{broken[1]} (engine {self.name})")


def _check_per_stage(plan, where: str) -> None:
    """A mode per stage is what the searches choose (``formulations/hetero.md``, "Decisions"):
    each stage recomputes all of its layers or none, with one chunk per stage and no block method."""
    if set(plan.recompute) - set(PER_STAGE_MODES):
        raise InputError(f"{where}.recompute", f"a mode per stage is 'none' or 'full' (each stage recomputes all of "
                                               f"its layers or none), got {list(plan.recompute)}: give one mode "
                                               "for every stage to recompute selectively")
    if plan.recompute_layers:
        raise InputError(f"{where}.recompute_layers", "the block method recomputes the first layers of every stage "
                                                      "in one mode: drop recompute_layers, or give one mode")
    if plan.virtual_stages > 1:
        raise InputError(f"{where}.recompute", "a mode per stage needs virtual_stages 1 (an interleaved stage's "
                                               "chunks would each need one): give one mode")


@dataclass(frozen=True)
class Split:
    """Megatron's even split of the layers into chunks (``megatron_split``)."""

    boundaries: tuple[int, ...]  # chunk boundaries in the instance's layers
    embedding_counted: bool  # --account-for-embedding-in-pipeline-split
    loss_counted: bool  # --account-for-loss-in-pipeline-split


def megatron_split(instance, parts: int) -> Split | None:
    """Megatron-LM's split of the model into ``parts`` equal chunks (``get_num_layers_to_build``
    in ``megatron/core/transformer/transformer_block.py``): the transformer layers divide evenly,
    or do so once the embedding (the layers before the first transformer layer) and the loss
    (those after the last) each count as one layer (``--account-for-embedding-in-pipeline-split``,
    ``--account-for-loss-in-pipeline-split``, Megatron-Core 0.11 on); None when neither works.
    Without a counted embedding it joins the first chunk, without a counted loss the last."""
    first, last = instance.transformer_span
    n = instance.num_layers
    for emb, loss in _even_counts(first > 0, last - first, last < n, parts):
        size = (last - first + emb + loss) // parts
        boundaries = [0]
        for j in range(1, parts):
            boundaries.append(first - emb + j * size)
        boundaries.append(n)
        if all(a < b for a, b in zip(boundaries, boundaries[1:])):
            return Split(tuple(boundaries), emb, loss)
    return None


def _even_counts(pre: bool, body: int, post: bool, parts: int):
    """Megatron's ways of counting the embedding and the loss as a layer each, in its order of
    preference, under which ``body`` transformer layers split into ``parts`` equal chunks
    (``pre``, ``post``: whether other layers come before and after them): (embedding counted,
    loss counted) pairs."""
    for emb, loss in ((False, False), (True, True), (True, False), (False, True)):
        units = body + emb + loss
        if (pre or not emb) and (post or not loss) and units >= parts and units % parts == 0:
            yield emb, loss


def _splits_members(instance, parts: int) -> bool:
    """Whether Megatron's split into ``parts`` chunks exists for the layers behind an instance's
    blocks (:mod:`.coarsen`): a plan found over blocks runs on those layers, so its interleaving
    must be theirs too (true for an instance of single layers)."""
    if not instance.layer_facts["blocks"]:
        return True
    sizes = [max(1, len(layer.members)) for layer in instance.layers]
    first, last = instance.transformer_span
    return next(_even_counts(first > 0, sum(sizes[first:last]), last < len(sizes), parts), None) is not None


ENGINES = {
    "megatron": Engine("megatron", interleaving=True, context_parallel=True, sequence_parallel=True,
                       selective_recompute=True, per_stage_recompute=False, block_recompute=True,
                       sharded_zero_with_pipeline=1),
    "deepspeed": Engine("deepspeed", interleaving=False, context_parallel=False, sequence_parallel=False,
                        selective_recompute=False, per_stage_recompute=True, block_recompute=False,
                        sharded_zero_with_pipeline=1),
    # amp_opt's own runtime (``python -m amp_opt run``): Megatron's rules for uniform plans, a
    # recomputation mode per stage (none or full), and the whole space of per-stage degrees,
    # replicas on different types and uneven shares.
    "amp_opt": Engine("amp_opt", interleaving=True, context_parallel=True, sequence_parallel=True,
                      selective_recompute=True, per_stage_recompute=True, block_recompute=True,
                      sharded_zero_with_pipeline=1, uneven=True),
}


def engine_of(instance) -> Engine:
    """The engine an instance's plans must run on (``search.engine``, default megatron)."""
    return ENGINES[instance.search.engine]


def stages_choose_recompute(instance) -> bool:
    """Whether the searches let each stage choose full recomputation or none: the engine runs a
    mode per stage, ``search.per_stage_recompute`` is on and ``search.recompute`` holds both."""
    space = instance.search
    return (engine_of(instance).per_stage_recompute and space.per_stage_recompute
            and set(PER_STAGE_MODES) <= set(space.recompute))


def even_partition(instance, parts: int, *, exact: bool = False) -> tuple[int, ...] | None:
    """Megatron's split: transformer layers as evenly as possible over ``parts`` ranges.

    The layers before the first transformer layer (embedding, ...) join the first range,
    those after the last one (head, ...) the last.  When the counts do not divide, the
    first ranges get one layer more (numpy's ``array_split`` convention).  With ``exact``
    the ranges must be equal (Megatron's rule for virtual stages, :func:`megatron_split`,
    which may count the embedding and the loss as a layer each), else None.  Without
    transformer layers, or (without ``exact``) with more ranges than transformer layers,
    every layer counts.  None if ``parts`` exceeds the layer count.
    """
    n = instance.num_layers
    if parts > n:
        return None
    if exact:
        split = megatron_split(instance, parts)
        return None if split is None else split.boundaries
    first, last = instance.transformer_span
    if last - first < parts:
        first, last = 0, n
    size, extra = divmod(last - first, parts)
    boundaries = [first]
    for s in range(parts):
        boundaries.append(boundaries[-1] + size + (1 if s < extra else 0))
    boundaries[0], boundaries[-1] = 0, n
    return tuple(boundaries)
