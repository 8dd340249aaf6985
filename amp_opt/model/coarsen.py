"""Long models: runs of consecutive layers of one kind merged into blocks.

The searches tabulate every layer range [k, l), (L+1)^2 cells per table (``ranges.py``),
and their programs have (p-1) L binaries, so their memory and time grow with L^2 and
more.  Up to MAX_LAYERS layers they run as they are.  A longer model is searched over
*blocks*: each maximal run of consecutive layers of the same kind (tied layers stand
alone) is cut into blocks of equal size (within one layer), just enough that at most
MAX_LAYERS blocks remain.  A block is one layer of the coarse instance whose
parameters, FLOPs, activation memory, tensor-parallel traffic and measured times are the
sums of its members' and whose activation sent onward is its last member's.  Every cost
term of both cost models is a sum over a stage's layers (or, for p2p, the last layer's
activation), so a stage made of whole blocks costs exactly what the same layers cost in
the original model; the terms that are not sums (what full recomputation keeps, eq. H7,
and the largest buffers of H7 and H9) read the block's ``members``.  Interleaving splits
blocks evenly, which is Megatron's split of the layers when the blocks are equal; it is
searched only where the layers behind the blocks split evenly too (the engine's rule,
``engines._splits_members``), so that the plan runs on them.  What changes is the search space: stage boundaries fall on block
boundaries only, so the plan found is feasible and exactly priced but may not be the
optimum of the unrestricted problem; :mod:`amp_opt.search.blocks` says so in the result
and reports a bound that holds for every plan.

Models with more than MAX_LAYERS runs are refused (InputError naming ``model.layers``),
as are layer lists longer than MAX_MODEL_LAYERS (loading alone would take seconds and
hundreds of MB).
"""

from __future__ import annotations

import dataclasses
import math

from ..errors import InputError
from .instance import Instance, Layer, Profile, Split

MAX_LAYERS = 128  # layers searched as they are (Llama-3 405B: 126 transformer blocks, embedding and head)
MAX_MODEL_LAYERS = 131_072  # entries of a layer list that amp_opt loads at all


def runs(instance: Instance) -> list[tuple[int, int]]:
    """Maximal runs [a, b) of consecutive untied layers of one kind (tied layers stand alone)."""
    out: list[tuple[int, int]] = []
    start = 0
    layers = instance.layers
    for i in range(1, instance.num_layers + 1):
        if (i == instance.num_layers or layers[i].tie is not None or layers[i - 1].tie is not None
                or layers[i].kind != layers[start].kind):
            out.append((start, i))
            start = i
    return out


def block_boundaries(instance: Instance, max_layers: int = MAX_LAYERS) -> tuple[int, ...] | None:
    """The boundaries (in original layers) of the fewest equal-size blocks per run that leave at
    most ``max_layers`` blocks; None if even whole runs as blocks are too many."""
    pieces = runs(instance)
    if len(pieces) > max_layers:
        return None
    longest = max(b - a for a, b in pieces)
    lo, hi = 1, longest  # block size: the smallest that leaves at most max_layers blocks
    while lo < hi:
        mid = (lo + hi) // 2
        if sum(math.ceil((b - a) / mid) for a, b in pieces) <= max_layers:
            hi = mid
        else:
            lo = mid + 1
    boundaries = [0]
    for a, b in pieces:
        count = math.ceil((b - a) / lo)
        boundaries += [a + round((b - a) * (j + 1) / count) for j in range(count)]
    return tuple(boundaries)


def coarsen(instance: Instance, max_layers: int = MAX_LAYERS) -> tuple[Instance, tuple[int, ...]] | None:
    """The instance over blocks and the blocks' boundaries in original layers, or None when the
    model has at most ``max_layers`` layers.  Raises InputError when it cannot be coarsened."""
    L = instance.num_layers
    if L <= max_layers:
        return None
    boundaries = block_boundaries(instance, max_layers)
    if boundaries is None:
        raise InputError("instance.model.layers",
                         f"{L} layers in {len(runs(instance))} runs of one kind: amp_opt searches at most "
                         f"{max_layers} layers, or longer models whose runs of layers of one kind merge into at "
                         f"most {max_layers} blocks")
    layers = tuple(_block(instance.layers[a:b]) for a, b in zip(boundaries, boundaries[1:]))
    profiles = tuple(Profile(p.device_type, p.tp, p.micro_batch,
                             tuple(float(sum(p.layer_times[a:b])) for a, b in zip(boundaries, boundaries[1:])))
                     for p in instance.profiles)
    search = dataclasses.replace(instance.search, max_pp=min(instance.search.max_pp, len(layers)))
    note = (f"the {L} layers were merged into {len(layers)} blocks of consecutive layers "
            "(stage boundaries on block boundaries only)")
    coarse = dataclasses.replace(instance, layers=layers, profiles=profiles, search=search,
                                 notes=instance.notes + (note,))
    return coarse, boundaries


def _block(members) -> Layer:
    if len(members) == 1:
        return members[0]
    first, last = members[0], members[-1]

    def total(field: str) -> Split:
        parts = [getattr(m, field) for m in members]
        return Split(sum(p.replicated for p in parts), sum(p.sharded for p in parts))

    flops = None if any(m.flops is None for m in members) else sum(m.flops for m in members)
    return Layer(name=f"{first.name}..{last.name}", kind=first.kind, params=total("params"),
                 activation_bytes=last.activation_bytes, activation_memory_bytes=total("activation_memory_bytes"),
                 flops=flops, tp_comm_bytes=sum(m.tp_comm_bytes for m in members),
                 attention_memory_bytes=total("attention_memory_bytes"),
                 attention_flops=sum(m.attention_flops for m in members), kv_bytes=total("kv_bytes"),
                 tp_comm_messages=sum(m.tp_comm_messages for m in members),
                 members=tuple(members))
