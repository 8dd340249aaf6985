"""Benchmark rows: what one run reported, and the CSV row it becomes (pure functions)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .suites import BenchInstance

# The first nine are the fixed interface (keep these names); then the field's per-run measures,
# then the instance, the run's statistics, its plan against the baselines, and the errors.
COLUMNS = (
    "instance", "solver", "repeat", "seed", "status", "objective", "bound", "gap", "wall_time",
    "time_to_first", "time_to_1pct_gap", "primal_integral", "solved", "wrong",
    "suite", "devices", "nodes", "gpu_types", "layers", "global_batch", "time_limit", "threads", "load",
    "cpu_time", "peak_rss_mib", "programs", "bb_nodes", "model_size", "plan",
    "amp_opt_s", "amp_optimum_s", "amp_optimum_fits", "amp_status", "amp_fit_s", "amp_fit_rank", "expert_s", "expert_plan",
    "ideal_s", "speedup_vs_amp", "speedup_vs_expert", "ratio_to_ideal",
    "baseline_wall_s", "baseline_peak_rss_mib", "error", "baseline_error",
)
# Columns that depend on how fast the machine ran (everything else repeats exactly, whichever
# executor ran the jobs, as long as no run stops at its time limit).
TIMING_COLUMNS = ("wall_time", "time_to_first", "time_to_1pct_gap", "primal_integral", "load", "cpu_time",
                  "peak_rss_mib",
                  "baseline_wall_s", "baseline_peak_rss_mib", "model_size")


@dataclass(frozen=True)
class SolveRun:
    """One solver on one instance, as its child process reported it (plain data)."""

    status: str  # OPTIMAL, FEASIBLE, UNKNOWN, INFEASIBLE, INPUT_ERROR, FAILED, TIMEOUT, CRASHED
    wall_time: float  # the child's solve call, or the parent's wait for a killed child
    peak_rss_mib: float | None
    objective: float | None = None
    bound: float | None = None
    gap: float | None = None
    plan_time: float | None = None  # evaluate(plan, "hetero") of the solver's best plan
    plan: dict | None = None
    extra: dict = field(default_factory=dict)
    trace: list = field(default_factory=list)  # [seconds, best plan value, proven bound]
    programs: list = field(default_factory=list)  # per program statistics (MIP drivers)
    load: float | None = None  # the machine's 1-minute load average when the run ended
    cpu_time: float | None = None  # user + system CPU seconds of the solve (CBC's process included)
    error: str = ""


@dataclass(frozen=True)
class BaselineRun:
    """The baselines of one instance (hetero seconds), as their child reported them."""

    wall_s: float | None = None
    peak_rss_mib: float | None = None
    amp_optimum_s: float | None = None
    amp_optimum_fits: bool | None = None
    amp_model_s: float | None = None
    amp_status: str = ""
    amp_fit_s: float | None = None
    amp_fit_rank: int | None = None
    amp_fit_plan: dict | None = None
    amp_optimum_plan: dict | None = None
    expert_s: float | None = None
    expert_plan: dict | None = None
    expert_reason: str = ""
    ideal_s: float | None = None
    error: str = ""


def fields_of(cls, data: dict) -> dict:
    """The entries of ``data`` that are fields of the dataclass ``cls`` (a child's answer may carry more)."""
    names = cls.__dataclass_fields__
    return {k: v for k, v in data.items() if k in names}


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b is not None and b > 0 else None


def plan_label(plan: dict | None) -> str:
    """A plan's degrees in one short string ("tp=4 dp=2 pp=2 mb=1"; cp when above 1)."""
    if not plan:
        return ""
    cp = f" cp={plan['cp']}" if plan.get("cp", 1) > 1 else ""
    return f"tp={plan['tp']}{cp} dp={plan['dp']} pp={plan['pp']} mb={plan['micro_batch']}"


def make_row(inst: BenchInstance, solver: str, run: SolveRun, base: BaselineRun | None, *, repeat: int = 0,
             seed: int = 0, time_limit: float | None = None, threads: int = 1) -> dict[str, Any]:
    """One CSV row: the run, the baselines (empty without them) and the ratios between their hetero times.

    speedup_vs_amp compares with the AMP plan one could deploy: the amp-model optimum if it fits, else the
    best amp-ranked plan that fits (amp_fit_s, equal to amp_optimum_s when the optimum fits).
    ratio_to_ideal = amp_opt_s / ideal_s >= 1.  The cross-run columns (solved, wrong,
    primal_integral) and the trace columns are filled by :mod:`amp_opt.bench.stats`.
    """
    base = base or BaselineRun()
    extra = {k: v for k, v in run.extra.items() if k != "placement"}
    row = {
        "instance": inst.name, "solver": solver, "repeat": repeat, "seed": seed, "status": run.status,
        "objective": run.objective, "bound": run.bound, "gap": run.gap, "wall_time": run.wall_time,
        "time_to_first": None, "time_to_1pct_gap": None, "primal_integral": None, "solved": None, "wrong": "",
        "suite": inst.suite, "devices": inst.devices, "nodes": inst.nodes,
        "gpu_types": inst.gpu_types, "layers": inst.layers, "global_batch": inst.global_batch,
        "time_limit": time_limit, "threads": threads, "load": run.load,
        "cpu_time": run.cpu_time, "peak_rss_mib": run.peak_rss_mib,
        "programs": len(run.programs) if run.programs else (0 if run.status in ("OPTIMAL", "FEASIBLE") else None),
        "bb_nodes": sum(p.get("nodes") or 0 for p in run.programs) if run.programs else None,
        "model_size": " ".join(f"{k}={v}" for k, v in sorted(extra.items())),
        "plan": plan_label(run.plan), "amp_opt_s": run.plan_time,
        "amp_optimum_s": base.amp_optimum_s, "amp_optimum_fits": base.amp_optimum_fits, "amp_status": base.amp_status,
        "amp_fit_s": base.amp_fit_s, "amp_fit_rank": base.amp_fit_rank,
        "expert_s": base.expert_s, "expert_plan": plan_label(base.expert_plan), "ideal_s": base.ideal_s,
        "speedup_vs_amp": ratio(base.amp_fit_s, run.plan_time),
        "speedup_vs_expert": ratio(base.expert_s, run.plan_time),
        "ratio_to_ideal": ratio(run.plan_time, base.ideal_s),
        "baseline_wall_s": base.wall_s, "baseline_peak_rss_mib": base.peak_rss_mib,
        "error": run.error, "baseline_error": base.error,
    }
    assert tuple(row) == COLUMNS
    return row
