"""Lower bounds on the iteration time of any plan of a candidate (``formulations/mip.md``, eq. B1-B3).

They prune the outer loop of the enumerator and the MIPs, and certify gaps.
Communication is left out (it only adds), so only compute is bounded:

    time >= (n-1) * T_lb + S_lb

* amp: every stage runs the blended profile; T_lb is the exact min-max
  partition of it into p stages and S_lb the whole model's time (B1).
* hetero: give each stage the slowest compute class among its groups (a label).
  A stage labelled with one of the k fastest classes uses only groups of those
  classes, so at most floor(G_1 + ... + G_k) / dp stages carry such labels.
  T_lb is the min over labelled partitions of the largest stage time, by a DP
  over (labels used so far, layer position) when that is small enough (B2),
  else the larger of a fractional speed bound and the min-max partition of the
  per-layer fastest times (B3).  S_lb = sum over layers of the fastest time.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from .profiles import layer_times

DP_BUDGET = 1.5e8  # cells of the labelled DP before falling back to B3


def _range_sums(times: np.ndarray) -> np.ndarray:
    prefix = np.concatenate([[0.0], np.cumsum(times)])
    table = prefix[None, :] - prefix[:, None]
    k, l = np.meshgrid(np.arange(len(prefix)), np.arange(len(prefix)), indexing="ij")
    return np.where(k < l, table, np.inf)


def min_max_partition(times: np.ndarray, parts: int) -> float:
    """The smallest possible largest part when splitting ``times`` into ``parts`` contiguous parts."""
    table = _range_sums(times)
    best = np.full(len(times) + 1, np.inf)
    best[0] = 0.0
    for _ in range(parts):
        best = np.maximum(best[:, None], table).min(axis=0)
    return float(best[-1])


def compute_classes(instance, tp: int, micro_batch: int, dp: int = 1):
    """Per compute class (device type, intra link), fastest first: (per-layer times, groups,
    memory capacity, the fastest ring link a stage holding such a group can have)."""
    info: dict[tuple[str, float], list] = {}
    for node in instance.nodes:
        key = (node.device_type, node.intra_bandwidth)
        groups = node.devices // tp
        link = max(node.inter_bandwidth, node.intra_bandwidth if groups >= dp else 0.0)
        entry = info.setdefault(key, [0, 0.0])
        entry[0] += groups
        entry[1] = max(entry[1], link)
    out = [(layer_times(instance, t, bw, tp, micro_batch).seconds, g, instance.device_types[t].memory, link)
           for (t, bw), (g, link) in info.items()]
    return sorted(out, key=lambda c: float(c[0].sum()))


def candidate_lower_bound(instance, cand, cost_model: str, labelled: bool = True) -> float:
    """A bound no plan of the candidate (tp, dp, pp, micro-batch) beats, in seconds; inf if none fits.

    ``labelled=False`` skips the labelled DP (B2) for the cheap B3, for callers that refine the
    bound themselves (the MIPs' kind bound, eq. B4).  Remembered per instance: the enumerator and
    the MIPs (``--solver auto`` runs both) ask for it.
    """
    key = ("lower_bound", cand, cost_model, labelled)
    if key not in instance.memo:
        instance.memo[key] = _lower_bound(instance, cand, cost_model, labelled)
    return instance.memo[key]


def _lower_bound(instance, cand, cost_model: str, labelled: bool = True) -> float:
    n, p = cand.n_micro(instance), cand.pp
    if cost_model == "amp":
        blended = np.zeros(instance.num_layers)
        for node in instance.nodes:
            blended += node.devices / instance.num_devices * layer_times(
                instance, node.device_type, node.intra_bandwidth, cand.tp, 1).seconds
        blended *= cand.micro_batch
        return (n - 1) * min_max_partition(blended, p) + float(blended.sum())
    classes = compute_classes(instance, cand.tp, cand.micro_batch, cand.dp)
    caps = _caps(classes, cand.dp, p)
    C, L = len(classes), instance.num_layers
    if labelled:
        vectors = [v for v in itertools.product(*(range(c + 1) for c in caps))
                   if sum(v) <= p and all(sum(v[: i + 1]) <= caps[i] for i in range(C))]
        if len(vectors) * C * (L + 1) ** 2 <= DP_BUDGET:
            return _labelled_bound(instance, cand, classes, caps, vectors)
    fastest = np.min([c[0] for c in classes], axis=0)
    return (n - 1) * _fractional_bottleneck(classes, caps, p) + float(fastest.sum())


def _caps(classes, dp: int, p: int) -> list[int]:
    """Most stages whose slowest class is among the k fastest, k = 1..C."""
    total, caps = 0, []
    for _, g, *_ in classes:
        total += g
        caps.append(min(p, total // dp))
    caps[-1] = p
    return caps


def _labelled_bound(instance, cand, classes, caps, vectors) -> float:
    """Eq. B2: DPs over (labels used so far, layer position), with memory.

    Stage s labelled c holds a group of class c, so it runs no faster than c
    (E >= range time of c), fits no more memory than c's capacity, and reduces
    its gradients no faster than c's best ring link.  The three terms are
    minimised separately, which keeps their sum a valid bound.
    """
    from .cost import StageCosts, allreduce_factor

    n, p, d = cand.n_micro(instance), cand.pp, cand.dp
    L, C = instance.num_layers, len(classes)
    first = instance.node_first_device[0]
    stage = (tuple(range(first, first + cand.tp)),) * d
    base = StageCosts(instance, "hetero", cand.tp, d, p, cand.micro_batch, (stage,) * p)
    k, l = np.meshgrid(np.arange(L + 1), np.arange(L + 1), indexing="ij")
    kk, ll = np.where(k < l, k, 0), np.where(k < l, l, 1)
    params = base.sums.params_in(kk, ll)
    compute = [_range_sums(c[0]) for c in classes]
    allreduce = [np.where(k < l, params * allreduce_factor(instance, d, c[3]), np.inf) for c in classes]
    fits = []
    for s in range(p):
        memory = base.memory(s, kk, ll)
        room = (k < l) & (k >= s) & (l <= L - (p - 1 - s))
        fits.append([room & (memory <= c[2]) for c in classes])

    def ok(v):
        return all(sum(v[: i + 1]) <= caps[i] for i in range(C))

    start = np.full(L + 1, np.inf)
    start[0] = 0.0
    best = {(0,) * C: (start, start, start)}  # min max E, min sum E, min max AR
    for v in sorted(vectors, key=sum):
        if v not in best or sum(v) == p:
            continue
        s = sum(v)
        bmax, bsum, bar = best[v]
        for c in range(C):
            w = v[:c] + (v[c] + 1,) + v[c + 1:]
            if not ok(w):
                continue
            mask = fits[s][c]
            rows = (
                np.where(mask, np.maximum(bmax[:, None], compute[c]), np.inf).min(axis=0),
                np.where(mask, bsum[:, None] + compute[c], np.inf).min(axis=0),
                np.where(mask, np.maximum(bar[:, None], allreduce[c]), np.inf).min(axis=0),
            )
            best[w] = tuple(np.minimum(a, b) for a, b in zip(best[w], rows)) if w in best else rows
    finals = [rows for v, rows in best.items() if sum(v) == p]
    if not finals:
        return np.inf
    t_lb = min(r[0][L] for r in finals)
    s_lb = min(r[1][L] for r in finals)
    u_lb = min(r[2][L] for r in finals)
    if not np.isfinite(t_lb):
        return np.inf
    return float((n - 1) * t_lb + s_lb + u_lb)


def _fractional_bottleneck(classes, caps, p: int) -> float:
    """B3: max of the fractional speed bound and the min-max partition of per-layer fastest times."""
    reference = classes[0][0]
    safe = np.where(reference > 0, reference, 1.0)
    ratios = [float(np.min(np.where(reference > 0, t / safe, np.inf))) if np.any(reference > 0) else 1.0
              for t, *_ in classes]
    # A stage labelled k runs at most 1/rho_k of the reference speed; taking the suffix maximum
    # makes the speeds non-increasing in k, so filling the fastest labels first maximises the
    # total speed under the nested caps (and only over-estimates it, which keeps the bound valid).
    speeds = [1.0 / rho if rho > 0 and math.isfinite(rho) else math.inf for rho in ratios]
    speeds = [max(speeds[k:]) for k in range(len(speeds))]
    taken, speed = 0, 0.0
    for cap, v in zip(caps, speeds):
        count = max(0, min(cap, p) - taken)
        speed += count * v
        taken += count
    work = float(reference.sum())
    fractional = work / speed if 0 < speed < math.inf else 0.0
    fastest = np.min([c[0] for c in classes], axis=0)
    return max(fractional, min_max_partition(fastest, p))
