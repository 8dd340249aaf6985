"""Whether memory lets any configuration of the class-stage space R at one micro-batch hold the model
(S15 of ``formulations/uneven-search.md``).

S11 prices one order of blocks, with each stage's micro-batches in flight; the walk's key cannot
(it does not know the order) and counts one per stage.  Counted from the pipeline's end, a stage's
flight depends on its position only, so a dynamic program over (classes used, first layer held)
from the last stage backwards decides, for every combination of the classes' blocks in every order
at once, whether some partition fits every stage by S11's test.  Where none does, the walk drops
that micro-batch whole; where no micro-batch is left, R holds no plan that fits.
"""

from __future__ import annotations

import numpy as np

from .class_bounds import Bounds
from .class_stages import Block


def _flight(from_end: int, n: int) -> int:
    """Micro-batches a stage keeps activations for, the ``from_end``-th from the pipeline's end
    (1 for the last) of a pipeline of ``n`` micro-batches under 1F1B: min(p - s, n) (H5, S11)."""
    return min(from_end, n)


def reaches(bounds: Bounds, M: int, options, top: int, *, stop=None) -> bool:
    """Whether some order of some combination of ``options`` (per node class its blocks at M, None
    for no block: :func:`.class_stages.blocks`) of at most ``top`` stages has a partition of the
    layers whose every stage holds at least a layer and passes S11's memory test
    (:meth:`.class_bounds.Bounds.usable`).  False proves that no plan of R at M fits (S15).
    ``stop()`` (the caller's clock) ends it early with True, which proves nothing.

    Examples
    --------
    >>> from amp_opt import load_instance
    >>> from amp_opt.model.tables import Tables
    >>> from amp_opt.search.class_bounds import Bounds
    >>> from amp_opt.search.class_stages import blocks, depth
    >>> from amp_opt.search.options import solve_options
    >>> inst = load_instance("instances/amp_het_cluster.json")
    >>> bounds = Bounds(inst, Tables(inst), solve_options().model)
    >>> reaches(bounds, 1, blocks(inst, 1), depth(inst))
    True
    """
    if not bounds.holds:
        return True
    L = bounds.instance.num_layers
    n = bounds.instance.training.global_batch // M
    kinds: dict = {}  # per position in ``options``, per (class, tp, dp, share): the stage counts its blocks take
    for c, opts in enumerate(options):
        for b in opts:
            if b is not None:
                kinds.setdefault(c, {}).setdefault((b.cls, b.tp, b.dp, b.share), set()).add(b.stages)
    over = top + 1
    least = np.full((1 << len(options), L + 1), over)  # fewest stages holding layers [i, L) with the classes S
    least[0, L] = 0
    for S in range(1 << len(options)):
        row = least[S]
        for q in np.unique(row[row < over]).tolist():  # fewer stages after these layers dominate (S15)
            start = row == q
            for c in (c for c in kinds if not S >> c & 1):
                T = S | 1 << c
                for (cls, tp, dp, share), counts in kinds[c].items():
                    if stop is not None and stop():
                        return True
                    b, held = Block(cls, 1, tp, dp, share), start
                    for k in range(1, min(max(counts), top - q) + 1):
                        # the k-th stage of the block from its end may start at l when it can hold [l, m)
                        # for some m at which the later stages start
                        held = bounds.usable(b, _flight(q + k, n))[:, held].any(axis=1)
                        if not held.any():
                            break
                        if k in counts:
                            least[T] = np.where(held, np.minimum(least[T], q + k), least[T])
                            if held[0]:
                                return True  # these blocks hold every layer within the stages allowed
    return False
