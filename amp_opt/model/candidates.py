"""The outer search space: (tp, dp, pp, micro-batch) candidates, as AMP defines it.

tp ranges over the allowed degrees that divide every node's device count; dp
over the divisors of devices/tp; pp = devices / (tp*dp), at most the layer
count (and ``search.max_pp``); the micro-batch over the allowed sizes with
dp*micro_batch dividing the global batch.
"""

from __future__ import annotations

from .plan import Candidate


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def allowed_tp(instance) -> list[int]:
    return [m for m in instance.search.tp if all(node.devices % m == 0 for node in instance.nodes)]


def candidates(instance) -> list[Candidate]:
    """Every candidate of the search space, in a fixed order."""
    n_dev, batch = instance.num_devices, instance.training.global_batch
    out = []
    for m in allowed_tp(instance):
        for d in divisors(n_dev // m):
            p = n_dev // (m * d)
            if p > instance.search.max_pp:
                continue
            for b in instance.search.micro_batches:
                if batch % (d * b) == 0:
                    out.append(Candidate(m, d, p, b))
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
