"""Assemble a run record (one element of RUNS.json) from every rank's measurements.

Shape (seconds, bytes)::

    {"plan": <Plan.to_json()>,
     "iteration_time": median over iterations of the slowest rank's iteration,
     "peak_memory": max over ranks,
     "memory_limit": bytes of memory each device had (--memory-limit, else the smallest GPU's
                     total memory; absent on CPU without a limit),
     "measured": {
        "iteration_times": [per measured iteration, max over ranks],
        "micro_batches_per_iteration": n,
        "losses": [per iteration incl. warm-up: the batch's mean loss],
        "stages": [{"stage", "layers": [k, l], "tp", "dp", "shares", "compute", "compute_per_micro_batch",
                    "p2p", "allreduce", "tie_allreduce", "tp_comm", "optimizer",
                    "peak_memory", "memory": {parts of the slowest/fullest rank}}],
        "ranks": [{"rank", "stage", "dp_rank", "tp_rank", "share", "device", "threads", "peak_memory",
                   "compute_per_micro_batch"}],
        "memory_kind": "tracked" | "allocator",
        "threads": per process (a list by rank when they differ), "provenance": {...}, "notes": [...]}}

A plan of several pipelines (:func:`assemble_pipelines`) gives one count per pipeline in
``micro_batches_per_iteration`` and a ``pipeline`` in each stage and rank.

A stage's term is the largest over its ranks of that rank's median over the
measured iterations (the slowest replica sets the pace, as in eq. H1).  ``tp``, ``dp`` and
``shares`` (samples of each micro-batch per replica) are the stage's own; each rank's own
``compute_per_micro_batch`` (at its replica's share) shows which replica sets the stage's pace.
"""

from __future__ import annotations

import statistics

TERMS = ("compute", "p2p", "allreduce", "tie_allreduce", "tp_comm", "optimizer")


def _median(records, key: str) -> float:
    return float(statistics.median(r.get(key, 0.0) for r in records))


def run_memory_limit(memory_limit: int | None, ranks) -> int | None:
    """The ``memory_limit`` of a run record: the simulated limit if one was set, else the smallest
    device memory the ranks report (None when any rank reports none: CPU).

    Examples
    --------
    >>> run_memory_limit(None, [{"device_memory": 16 * 2**30}, {"device_memory": 15 * 2**30}]) == 15 * 2**30
    True
    >>> run_memory_limit(30_000_000, [{"device_memory": None}]), run_memory_limit(None, [{"device_memory": None}])
    (30000000, None)
    """
    if memory_limit is not None:
        return memory_limit
    sizes = [r.get("device_memory") for r in ranks]
    return min(sizes) if sizes and all(sizes) else None


def assemble(plan: dict, ranks: list[dict], *, layout, provenance: dict, memory_limit: int | None = None) -> dict:
    """The run record of a finished run (see the module docstring for its shape); ``layout`` is the
    plan's :class:`amp_opt.runtime.layout.Layout`."""
    n = layout.n_micro
    iterations = len(ranks[0]["records"])
    iteration_times = [max(r["records"][i]["iteration"] for r in ranks) for i in range(iterations)]
    stages = []
    for s in range(plan["pp"]):
        mine = [r for r in ranks if r["stage"] == s]
        entry = {"stage": s, "layers": mine[0]["layers"], "tp": layout.tp[s], "dp": layout.dp[s],
                 "shares": list(layout.shares[s])}
        for term in TERMS:
            entry[term] = max(_median(r["records"], term) for r in mine)
        entry["compute_per_micro_batch"] = entry["compute"] / n
        fullest = max(mine, key=lambda r: r["peak_memory"])
        entry["peak_memory"] = fullest["peak_memory"]
        entry["memory"] = fullest["memory"]
        stages.append(entry)
    # each replica of the last stage reports its samples' part of the batch's mean loss
    last = [r for r in ranks if r["stage"] == plan["pp"] - 1 and r["tp_rank"] == 0]
    losses = [sum(r["losses"][i] for r in last) for i in range(len(last[0]["losses"]))]
    notes = []
    if ranks[0]["memory_kind"] == "tracked":
        notes.append("peak_memory is tracked, not an allocator figure: parameters + gradients + Adam moments + "
                     "dp buffer + peak of saved activations and pipeline buffers")
    notes.append("p2p is time blocked in send/recv, pipeline bubbles included")
    if max(layout.tp) > 1:
        notes.append("embedding and head are replicated on every tensor-parallel rank (not vocab-parallel)")
    limit = run_memory_limit(memory_limit, ranks)
    threads = [r.get("threads", provenance["threads"]) for r in ranks]
    return {
        "plan": plan,
        "iteration_time": float(statistics.median(iteration_times)),
        "peak_memory": max(r["peak_memory"] for r in ranks),
        **({"memory_limit": limit} if limit is not None else {}),
        "measured": {
            "iteration_times": iteration_times,
            "micro_batches_per_iteration": n,
            "losses": losses,
            "stages": stages,
            "ranks": [{**{k: r[k] for k in ("rank", "stage", "dp_rank", "tp_rank", "share", "device", "threads",
                                       "peak_memory")},
                       "compute_per_micro_batch": _median(r["records"], "compute") / n} for r in ranks],
            "memory_kind": ranks[0]["memory_kind"],
            "threads": threads[0] if len(set(threads)) == 1 else threads,
            "provenance": provenance,
            "notes": notes,
        },
    }


def assemble_pipelines(plan: dict, ranks: list[dict], *, pipes, provenance: dict,
                       memory_limit: int | None = None) -> dict:
    """The run record of a plan of several pipelines: each pipeline's record assembled as one
    (:func:`assemble`) from its own ranks, then joined: the iteration is the slowest rank's, the
    loss the sum of every pipeline's part, the stages every pipeline's (each with ``pipeline``),
    ``micro_batches_per_iteration`` one count per pipeline; ``pipes`` is
    :func:`amp_opt.runtime.layout.pipelines_of` of the plan."""
    parts = [assemble(pipe.plan, [r for r in ranks if r["pipeline"] == i], layout=pipe.lay, provenance=provenance,
                      memory_limit=memory_limit) for i, pipe in enumerate(pipes)]
    iterations = len(ranks[0]["records"])
    iteration_times = [max(r["records"][k]["iteration"] for r in ranks) for k in range(iterations)]
    first = parts[0]["measured"]
    notes = list(dict.fromkeys(n for part in parts for n in part["measured"]["notes"]))
    notes.append("allreduce sums each segment of the pipelines' joint partition over every replica holding it; "
                 "tie_allreduce the tied word table within and across the pipelines")
    threads = [r.get("threads", provenance["threads"]) for r in sorted(ranks, key=lambda r: r["rank"])]
    limit = run_memory_limit(memory_limit, ranks)
    return {
        "plan": plan,
        "iteration_time": float(statistics.median(iteration_times)),
        "peak_memory": max(r["peak_memory"] for r in ranks),
        **({"memory_limit": limit} if limit is not None else {}),
        "measured": dict(
            first, iteration_times=iteration_times, micro_batches_per_iteration=[pipe.lay.n_micro for pipe in pipes],
            losses=[sum(part["measured"]["losses"][k] for part in parts) for k in range(len(first["losses"]))],
            stages=[dict(stage, pipeline=i) for i, part in enumerate(parts) for stage in part["measured"]["stages"]],
            ranks=[dict(rank, pipeline=i) for i, part in enumerate(parts) for rank in part["measured"]["ranks"]],
            threads=threads[0] if len(set(threads)) == 1 else threads, notes=notes),
    }
