"""Benchmark rows: what one run reported, and the CSV row it becomes (pure functions)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .suites import BenchInstance

COLUMNS = (
    "suite", "instance", "devices", "nodes", "gpu_types", "layers", "global_batch",
    "solver", "status", "objective_s", "bound_s", "gap", "wall_s", "peak_rss_mib", "model_size", "plan",
    "amp_opt_s", "amp_pick_s", "amp_pick_fits", "amp_status", "amp_fit_s", "amp_fit_rank", "expert_s", "expert_plan",
    "ideal_s", "speedup_vs_amp", "speedup_vs_expert", "ratio_to_ideal",
    "baseline_wall_s", "baseline_peak_rss_mib", "error", "baseline_error",
)


@dataclass(frozen=True)
class SolveRun:
    """One solver on one instance, as its child process reported it (plain data)."""

    status: str  # OPTIMAL, FEASIBLE, UNKNOWN, INFEASIBLE, INPUT_ERROR, ERROR, TIMEOUT, CRASHED
    wall_s: float  # the child's solve call, or the parent's wait for a killed child
    peak_rss_mib: float | None
    objective_s: float | None = None
    bound_s: float | None = None
    gap: float | None = None
    time_s: float | None = None  # evaluate(plan, "hetero") of the solver's best plan
    plan: dict | None = None
    extra: dict = field(default_factory=dict)
    error: str = ""


@dataclass(frozen=True)
class BaselineRun:
    """The baselines of one instance (hetero seconds), as their child reported them."""

    wall_s: float
    peak_rss_mib: float | None
    amp_pick_s: float | None = None
    amp_pick_fits: bool | None = None
    amp_model_s: float | None = None
    amp_status: str = ""
    amp_fit_s: float | None = None
    amp_fit_rank: int | None = None
    amp_fit_plan: dict | None = None
    amp_pick_plan: dict | None = None
    expert_s: float | None = None
    expert_plan: dict | None = None
    expert_reason: str = ""
    ideal_s: float | None = None
    error: str = ""


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b is not None and b > 0 else None


def plan_label(plan: dict | None) -> str:
    """A plan's degrees in one short string ("tp=4 dp=2 pp=2 mb=1")."""
    if not plan:
        return ""
    return f"tp={plan['tp']} dp={plan['dp']} pp={plan['pp']} mb={plan['micro_batch']}"


def make_row(inst: BenchInstance, solver: str, run: SolveRun, base: BaselineRun) -> dict[str, Any]:
    """One CSV row: the run, the baselines and the ratios between their hetero times.

    speedup_vs_amp compares with the AMP plan one could deploy: AMP's pick if it
    fits, else the best amp-ranked plan that fits (amp_fit_s, equal to
    amp_pick_s when the pick fits).  ratio_to_ideal = amp_opt_s / ideal_s >= 1.
    """
    extra = {k: v for k, v in run.extra.items() if k != "placement"}
    row = {
        "suite": inst.suite, "instance": inst.name, "devices": inst.devices, "nodes": inst.nodes,
        "gpu_types": inst.gpu_types, "layers": inst.layers, "global_batch": inst.global_batch,
        "solver": solver, "status": run.status, "objective_s": run.objective_s, "bound_s": run.bound_s,
        "gap": run.gap, "wall_s": run.wall_s, "peak_rss_mib": run.peak_rss_mib,
        "model_size": " ".join(f"{k}={v}" for k, v in sorted(extra.items())),
        "plan": plan_label(run.plan), "amp_opt_s": run.time_s,
        "amp_pick_s": base.amp_pick_s, "amp_pick_fits": base.amp_pick_fits, "amp_status": base.amp_status,
        "amp_fit_s": base.amp_fit_s, "amp_fit_rank": base.amp_fit_rank,
        "expert_s": base.expert_s, "expert_plan": plan_label(base.expert_plan), "ideal_s": base.ideal_s,
        "speedup_vs_amp": ratio(base.amp_fit_s, run.time_s),
        "speedup_vs_expert": ratio(base.expert_s, run.time_s),
        "ratio_to_ideal": ratio(run.time_s, base.ideal_s),
        "baseline_wall_s": base.wall_s, "baseline_peak_rss_mib": base.peak_rss_mib,
        "error": run.error, "baseline_error": base.error,
    }
    assert tuple(row) == COLUMNS
    return row
