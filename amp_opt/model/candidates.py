"""The outer search space: candidates (degrees and training settings) the inner search partitions.

As AMP defines it, tp ranges over the allowed degrees that divide every node's device
count; dp over the divisors of devices/(tp*cp); pp = devices / (tp*cp*dp), at most the
layer count (and ``search.max_pp``); the micro-batch over the allowed sizes with
dp*micro_batch dividing the global batch.  Beyond AMP (``formulations/hetero.md``,
"Decisions"), every candidate also fixes the context-parallel degree cp, sequence
parallelism, activation recomputation, the ZeRO stage and the virtual stages per device,
each within ``instance.search`` and the engine's rules (:mod:`.engines`), and within what
the cost model prices.  Settings that another setting beats on every term of the cost
model are left out (:func:`settings`); each such rule is stated there.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

from .costs import HETERO
from .engines import engine_of, even_partition, megatron_split, stages_choose_recompute
from .plan import Candidate


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def allowed_tp(instance) -> list[int]:
    return [m for m in instance.search.tp if all(node.devices % m == 0 for node in instance.nodes)]


def settings(instance, model, tp: int, cp: int, dp: int, pp: int, micro_batch: int) -> list[Candidate]:
    """The training settings of one (tp, cp, dp, pp, micro-batch) point: every combination the
    search space, the engine and the cost model allow, less the dominated ones.

    Dominance (``formulations/hetero.md``, "Decisions"): sequence parallelism with tp > 1
    (where the engine has it) keeps less memory and sends fewer p2p bytes at the same compute, so it replaces no
    sequence parallelism; ZeRO-1 and -2 move as many bytes as a plain allreduce and keep
    less memory, so the highest of stages 0-2 allowed replaces the lower ones when there
    is more than one replica (ZeRO-3 adds traffic and stays a choice); selective
    recomputation frees nothing when no layer keeps attention scores (FlashAttention) but
    still costs time, so it is left out then.  Full recomputation also comes with each block
    count of :func:`block_counts`.  On an engine whose stages may recompute differently
    (DeepSpeed, amp_opt), one candidate whose stages each choose full recomputation or none replaces
    the two uniform ones: it holds both, and each stage's faster fitting mode.  It has one chunk per
    stage, so an interleaved candidate (amp_opt) keeps the two uniform modes.
    """
    space, engine = instance.search, engine_of(instance)
    replicas = dp * cp
    can_sp = tp > 1 and engine.sequence_parallel  # sequence parallelism splits the tp group's activations
    sp = [True] if can_sp and True in space.sequence_parallel else [s for s in space.sequence_parallel if not s or can_sp]
    if not model.enforces_memory:  # the ZeRO stage only moves memory the model ignores
        zeros = [instance.training.zero_stage]
    else:
        allowed = [z for z in space.zero_stages if pp == 1 or z <= engine.sharded_zero_with_pipeline]
        lower = [z for z in allowed if z <= 2]
        zeros = ([max(lower)] if replicas > 1 else [min(lower)]) if lower else []
        zeros += [3] if 3 in allowed and replicas > 1 else []
    scores = instance.layer_facts["scores"]
    modes = [(r, 0, False) for r in space.recompute if r != "selective" or scores]
    if "full" in space.recompute:
        modes += [("full", r, False) for r in block_counts(instance, pp)]
    staged = stages_choose_recompute(instance) and model.enforces_memory and instance.layer_facts["recomputing"] > 0
    if staged:
        modes = [("full", 0, True)] + modes
    out = []
    for seq, zero, (mode, block, per_stage), v in itertools.product(sp, zeros, modes, space.virtual_stages):
        if per_stage and v > 1:
            continue  # a mode per stage needs one chunk per stage (engines.Engine.check)
        if staged and v == 1 and not per_stage and (mode, block) in (("none", 0), ("full", 0)):
            continue  # held by the per-stage candidate
        cand = Candidate(tp, dp, pp, micro_batch, cp, seq, mode, block, zero, v, per_stage)
        if model.prices(cand) and engine.rule(instance, cand) is None:
            out.extend([cand] if v == 1 else [replace(cand, chunks=c) for c in chunkings(instance, pp * v)])
    return out


# Chunkings of an interleaved candidate searched one by one at most: every chunking is a candidate
# of its own (the stage DP does not move interleaved chunks), so a 5-layer model's C(4, 3) = 4
# chunkings of 4 chunks are all searched, while a 30-layer model's C(29, 7) = 1.6e6 for pp*v = 8
# are not: its interleaved plans keep the engine's even split, and the result says so
# (:func:`interleaving_narrowed`).
MAX_CHUNKINGS = 64


def chunkings(instance, parts: int) -> list[tuple[int, ...]]:
    """The partitions an interleaved candidate of ``parts`` chunks is searched with: every one
    (the engine's even split first) when there are at most MAX_CHUNKINGS, else the even split."""
    even = even_partition(instance, parts, exact=True)
    n = instance.num_layers
    if _too_many_chunkings(n, parts):
        return [even]
    others = [(0, *cut, n) for cut in itertools.combinations(range(1, n), parts - 1)]
    return [even] + [c for c in others if c != even]


def _too_many_chunkings(layers: int, parts: int) -> bool:
    """Whether ``layers`` layers have more than MAX_CHUNKINGS partitions into ``parts`` chunks."""
    return math.comb(layers - 1, parts - 1) > MAX_CHUNKINGS


def interleaving_narrowed(instance, model) -> bool:
    """Whether some interleaved candidate of the instance (or of a part of its devices) keeps only
    the engine's even split of the layers (:data:`MAX_CHUNKINGS`), under a cost model that prices
    interleaving."""
    space, engine = instance.search, engine_of(instance)
    if not engine.interleaving or not model.prices(Candidate(1, 1, 2, 1, virtual_stages=2)):
        return False
    n = instance.num_layers
    return any(_too_many_chunkings(n, pp * v) and megatron_split(instance, pp * v) is not None
               for v in space.virtual_stages if v > 1
               for pp in range(2, min(space.max_pp, instance.num_devices) + 1) if pp * v <= n)


def block_counts(instance, pp: int) -> list[int]:
    """The block counts r of ``search.recompute_layers`` worth searching at pp stages (Megatron's
    block method: each stage recomputes its first r transformer layers): those below the most
    transformer layers one stage can hold, since a larger r recomputes every layer, as plain full
    recomputation does.  None over coarsened blocks of layers, where a block is not one layer."""
    if instance.layer_facts["blocks"] or not instance.search.recompute_layers:
        return []
    recomputing = instance.layer_facts["recomputing"]
    others = instance.num_layers - recomputing  # stages may hold only such layers
    most = recomputing - max(0, pp - 1 - others)
    return [r for r in instance.search.recompute_layers if r < most]


def candidates(instance, model=None) -> list[Candidate]:
    """Every candidate of the search space, in a fixed order (the cost model's, hetero by default)."""
    model = model or HETERO
    n_dev, batch, space = instance.num_devices, instance.training.global_batch, instance.search
    out = []
    for m in allowed_tp(instance):
        for cp in space.cp:
            if n_dev % (m * cp):
                continue
            for d in divisors(n_dev // (m * cp)):
                p = n_dev // (m * cp * d)
                if p > space.max_pp:
                    continue
                for b in space.micro_batches:
                    if batch % (d * b):
                        continue
                    out.extend(settings(instance, model, m, cp, d, p, b))
    return out


def why_empty(instance) -> str:
    """Explain, for an empty search space, which divisibility rule excludes everything."""
    sizes = sorted({node.devices for node in instance.nodes})
    tps = allowed_tp(instance)
    if not tps:
        return (
            f"no tensor-parallel degree in search.tp {list(instance.search.tp)} divides the device count of every node "
            f"(node sizes: {sizes})"
        )
    n_dev = instance.num_devices
    pairs = [(m, d) for m in tps for d in divisors(n_dev // m) if n_dev // (m * d) <= instance.search.max_pp]
    if not pairs:
        return (
            f"every (tp, dp) leaves more pipeline stages than layers: {n_dev} devices, "
            f"at most {instance.search.max_pp} stages"
        )
    return (
        f"no data-parallel degree times a micro-batch size in search.micro_batches {list(instance.search.micro_batches)} "
        f"divides the global batch {instance.training.global_batch} (possible dp: {sorted({d for _, d in pairs})})"
    )
