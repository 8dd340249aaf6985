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

DP_BUDGET = 3e7  # cells of the labelled DP before falling back to B3


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


def compute_classes(instance, tp: int, micro_batch: int):
    """(per-layer times, tensor-parallel groups) of each compute class (device type, intra link)."""
    groups: dict[tuple[str, float], int] = {}
    for node in instance.nodes:
        key = (node.device_type, node.intra_bandwidth)
        groups[key] = groups.get(key, 0) + node.devices // tp
    out = [(layer_times(instance, t, bw, tp, micro_batch).seconds, g) for (t, bw), g in groups.items()]
    return sorted(out, key=lambda tg: float(tg[0].sum()))


def candidate_lower_bound(instance, cand, cost_model: str) -> float:
    """A bound no plan of the candidate (tp, dp, pp, micro-batch) beats, in seconds."""
    n, p = cand.n_micro(instance), cand.pp
    if cost_model == "amp":
        blended = np.zeros(instance.num_layers)
        for node in instance.nodes:
            blended += node.devices / instance.num_devices * layer_times(
                instance, node.device_type, node.intra_bandwidth, cand.tp, 1).seconds
        blended *= cand.micro_batch
        return (n - 1) * min_max_partition(blended, p) + float(blended.sum())
    classes = compute_classes(instance, cand.tp, cand.micro_batch)
    fastest = np.min([t for t, _ in classes], axis=0)
    s_lb = float(fastest.sum())
    if n == 1:
        return s_lb
    return (n - 1) * labelled_bottleneck(classes, cand.dp, p) + s_lb


def _caps(classes, dp: int, p: int) -> list[int]:
    """Most stages whose slowest class is among the k fastest, k = 1..C."""
    total, caps = 0, []
    for _, g in classes:
        total += g
        caps.append(min(p, total // dp))
    caps[-1] = p
    return caps


def labelled_bottleneck(classes, dp: int, p: int) -> float:
    """T_lb of eq. B2, or B3 when the DP would be too large."""
    caps = _caps(classes, dp, p)
    C, L = len(classes), len(classes[0][0])
    vectors = [v for v in itertools.product(*(range(c + 1) for c in caps)) if sum(v) <= p]
    if len(vectors) * C * (L + 1) ** 2 > DP_BUDGET or C == 1:
        return _fractional_bottleneck(classes, caps, p)
    tables = [_range_sums(t) for t, _ in classes]

    def ok(v):
        return all(sum(v[: k + 1]) <= caps[k] for k in range(C))

    best: dict[tuple, np.ndarray] = {}
    start = np.full(L + 1, np.inf)
    start[0] = 0.0
    best[(0,) * C] = start
    for v in sorted(vectors, key=sum):
        if v not in best or sum(v) == p:
            continue
        for c in range(C):
            w = v[:c] + (v[c] + 1,) + v[c + 1:]
            if not ok(w):
                continue
            row = np.maximum(best[v][:, None], tables[c]).min(axis=0)
            best[w] = np.minimum(best[w], row) if w in best else row
    return float(min(row[L] for v, row in best.items() if sum(v) == p))


def _fractional_bottleneck(classes, caps, p: int) -> float:
    """B3: max of the fractional speed bound and the min-max partition of per-layer fastest times."""
    reference = classes[0][0]
    safe = np.where(reference > 0, reference, 1.0)
    ratios = [float(np.min(np.where(reference > 0, t / safe, np.inf))) if np.any(reference > 0) else 1.0
              for t, _ in classes]
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
    fastest = np.min([t for t, _ in classes], axis=0)
    return max(fractional, min_max_partition(fastest, p))
