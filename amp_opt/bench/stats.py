"""How the field reads a benchmark: solved counts, shifted geometric means, performance
profiles, primal integrals and performance variability (pure functions over result rows).

* **Solved**: the run proved its answer (status OPTIMAL, or INFEASIBLE: a proof that no plan
  fits) and no other run of the same instance contradicts it (:func:`mark_wrong`).
* **Shifted geometric mean** of times (Mittelmann's benchmarks; shift 1 s): unsolved runs
  count at their time limit, so a solver is never rewarded for failing fast.
* **Performance profile** (Dolan & More 2002): for each problem (instance and repeat) the ratio
  of a solver's time to the best solver's time on it (infinite when unsolved); rho_s(tau) is the
  fraction of problems solver s solves within tau times the best.  Every problem counts in
  the denominator, also those no solver solved.
* **Primal integral** (Berthold 2013): the integral over [0, time limit] of the primal gap
  |v(t) - v*| / max(|v(t)|, |v*|) of the best plan v(t) a run knew at time t, 1 before its
  first plan, against the best plan v* any run found for the instance.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict

from ..search.trace import first_plan_time, gap_at, primal_integral, time_to_gap

SHIFT = 1.0  # seconds, the shift of the geometric mean of times
SAME = 1e-5  # relative difference below which two plan values agree (CP-SAT's integer times, CBC's tolerances)
PROVEN = ("OPTIMAL", "INFEASIBLE")


def shifted_geomean(values, shift: float = SHIFT) -> float:
    values = list(values)
    if not values:
        return math.nan
    return math.exp(sum(math.log(v + shift) for v in values) / len(values)) - shift


def reference_values(rows) -> dict[str, float]:
    """The best plan value (hetero seconds, re-scored) any run found, per instance."""
    best: dict[str, float] = {}
    for row in rows:
        value = row.get("amp_opt_s")
        if value is not None and (row["instance"] not in best or value < best[row["instance"]]):
            best[row["instance"]] = value
    return best


def mark_wrong(rows) -> None:
    """Fill ``wrong`` (why a run's proof is contradicted by another run, else "") and ``solved``."""
    best = reference_values(rows)
    for row in rows:
        ref = best.get(row["instance"])
        why = ""
        if ref is not None:
            if row["status"] == "INFEASIBLE":
                why = f"claims no plan fits; another run found one of {ref:.6g} s"
            elif row["status"] == "OPTIMAL" and row.get("amp_opt_s") is not None and row["amp_opt_s"] > ref * (1 + SAME):
                why = f"claims {row['amp_opt_s']:.6g} s optimal; another run found {ref:.6g} s"
            elif row.get("bound") is not None and row["bound"] > ref * (1 + SAME):
                why = f"claims a bound of {row['bound']:.6g} s above a plan of {ref:.6g} s another run found"
        row["wrong"] = why
        row["solved"] = row["status"] in PROVEN and not why


def fill_times(row: dict, trace) -> None:
    """Time to the first plan and to a proven 1% gap, from a run's trace (its end point if it has none)."""
    points = [tuple(p) for p in trace or ()]
    if not points and row.get("objective") is not None and row.get("wall_time") is not None:
        points = [(row["wall_time"], row["objective"], row["bound"] if row.get("bound") is not None else -math.inf)]
    row["time_to_first"] = first_plan_time(points)
    row["time_to_1pct_gap"] = time_to_gap(points, 0.01)


def fill_primal_integrals(rows, traces: dict) -> None:
    """``primal_integral`` of every run against the best plan of its instance (``traces``: row key -> points)."""
    best = reference_values(rows)
    for row in rows:
        ref = best.get(row["instance"])
        if ref is None:  # no run found a plan: nothing to measure against
            row["primal_integral"] = None
            continue
        points = _points(row, traces)
        row["primal_integral"] = primal_integral(points, ref, row["time_limit"])


def _points(row, traces):
    points = [tuple(p) for p in traces.get(row_key(row), ()) or ()]
    if not points and row.get("amp_opt_s") is not None:  # no trace (a plug-in): its plan at its end
        points = [(row["wall_time"], row["amp_opt_s"], -math.inf)]
    return points


def row_key(row) -> tuple:
    return (row["instance"], row["solver"], row["repeat"])


def charged_time(row) -> float:
    """The time a run is charged: its wall time when solved, else its time limit."""
    return row["wall_time"] if row.get("solved") else row["time_limit"]


def solver_summary(rows) -> list[dict]:
    """Per solver: runs, solved, wrong, failed, shifted geometric mean time (unsolved at the limit) and
    its ratio to the best solver's, mean primal integral, median time to the first plan."""
    solvers = list(dict.fromkeys(row["solver"] for row in rows))
    out = []
    for solver in solvers:
        mine = [r for r in rows if r["solver"] == solver]
        integrals = [r["primal_integral"] for r in mine if r.get("primal_integral") is not None]
        firsts = [r["time_to_first"] for r in mine if r.get("time_to_first") is not None]
        out.append({
            "solver": solver, "runs": len(mine), "solved": sum(bool(r["solved"]) for r in mine),
            "optimal": sum(r["status"] == "OPTIMAL" and not r["wrong"] for r in mine),
            "infeasible": sum(r["status"] == "INFEASIBLE" and not r["wrong"] for r in mine),
            "wrong": sum(bool(r["wrong"]) for r in mine),
            "failed": sum(r["status"] in ("FAILED", "CRASHED", "TIMEOUT", "INPUT_ERROR") for r in mine),
            "sgm_time": shifted_geomean(charged_time(r) for r in mine),
            "mean_primal_integral": statistics.fmean(integrals) if integrals else None,
            "median_time_to_first": statistics.median(firsts) if firsts else None,
            "plans": len(firsts),
        })
    finite = [s["sgm_time"] for s in out if math.isfinite(s["sgm_time"])]
    best = min(finite, default=math.nan)
    for s in out:
        s["sgm_ratio"] = (s["sgm_time"] + SHIFT) / (best + SHIFT) if finite else math.nan
    return out


def performance_profile(rows) -> tuple[list[tuple], dict[str, list[float]]]:
    """Dolan-More: the problems (instance, repeat) and, per solver, its ratio to the best time on each
    problem (inf when it did not solve it or no solver did)."""
    problems = list(dict.fromkeys((r["instance"], r["repeat"]) for r in rows))
    solvers = list(dict.fromkeys(r["solver"] for r in rows))
    time = {(r["instance"], r["repeat"], r["solver"]): (max(r["wall_time"], 1e-3) if r["solved"] else math.inf)
            for r in rows}
    ratios: dict[str, list[float]] = {s: [] for s in solvers}
    for inst, rep in problems:
        best = min((time.get((inst, rep, s), math.inf) for s in solvers), default=math.inf)
        for s in solvers:
            t = time.get((inst, rep, s), math.inf)
            ratios[s].append(t / best if math.isfinite(t) else math.inf)
    return problems, ratios


def profile_value(ratios: list[float], tau: float) -> float:
    """rho(tau): the fraction of problems solved within tau times the best."""
    return sum(r <= tau for r in ratios) / len(ratios) if ratios else 0.0


def variability(rows) -> list[dict]:
    """Per solver, over the instances it ran more than once (different seeds): how far the repeats
    of one instance spread in time (max/min of the charged times, shift 1 s as in the means), in
    status and in plan value."""
    groups: dict[tuple, list] = defaultdict(list)
    for r in rows:
        groups[r["solver"], r["instance"]].append(r)
    out = []
    for solver in dict.fromkeys(r["solver"] for r in rows):
        mine = [g for (s, _), g in groups.items() if s == solver and len(g) > 1]
        if not mine:
            continue
        spreads = [(max(charged_time(r) for r in g) + SHIFT) / (min(charged_time(r) for r in g) + SHIFT) for g in mine]
        cvs = []
        for g in mine:
            times = [charged_time(r) for r in g]
            mean = statistics.fmean(times)
            cvs.append(statistics.pstdev(times) / mean if mean > 0 else 0.0)
        values = [[r["amp_opt_s"] for r in g if r.get("amp_opt_s") is not None] for g in mine]
        out.append({
            "solver": solver, "instances": len(mine), "repeats": max(len(g) for g in mine),
            "median_spread": statistics.median(spreads), "max_spread": max(spreads),
            "median_cv": statistics.median(cvs),
            "status_differs": sum(len({r["status"] for r in g}) > 1 for g in mine),
            "solved_differs": sum(len({bool(r["solved"]) for r in g}) > 1 for g in mine),
            "plan_differs": sum(bool(v) and (max(v) - min(v)) > SAME * min(v) for v in values),
        })
    return out


def mean_primal_gap_curve(rows, traces: dict, times: list[float]) -> dict[str, list[float]]:
    """Per solver, the mean over its runs of the primal gap at each time (for the gap-over-time plot)."""
    best = reference_values(rows)
    curves: dict[str, list[float]] = {}
    for solver in dict.fromkeys(r["solver"] for r in rows):
        mine = [r for r in rows if r["solver"] == solver and r["instance"] in best]
        if not mine:
            continue
        curves[solver] = [statistics.fmean(gap_at(_points(r, traces), t, best[r["instance"]]) for r in mine)
                          for t in times]
    return curves
