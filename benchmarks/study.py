"""Tables of the formulation study from a bench run's results.json (ablations, engines, formulations).

Usage (from the project root):

    python benchmarks/study.py benchmarks/results/formulations

Prints markdown: what each ingredient earns (the full CP-SAT pipeline against each ablation:
solved count and shifted geometric mean time, and their change), the engines side by side,
the two layer formulations on the same settings and, program by program, on the same
candidates, and the largest instances' objective, bound and gap per variant (where the
full pipelines report the same numbers).  Every number is computed from the file; the
definitions are those of ``amp_opt/bench/stats.py`` (benchmarks/README.md).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from amp_opt.bench import stats  # noqa: E402

ABLATIONS = [("cpsat-nokinds", "stage-kind search (phase 1b)"), ("cpsat-nodp", "phase 1 DP incumbents"),
             ("cpsat-nowarm", "warm starts"), ("cpsat-nocutoff", "cutoffs"), ("cpsat-nosym", "symmetry rows M12")]
PAIRS = [("cpsat", "cpsat-assign"), ("cpsat-nokinds", "cpsat-assign-nokinds"),
         ("highs-nokinds", "highs-assign-nokinds")]


def fmt(x, spec=".2f"):
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def load(folder: Path):
    doc = json.loads((folder / "results.json").read_text())
    return doc, doc["rows"]


def subset(rows, solvers, pred=lambda r: True):
    return [r for r in rows if r["solver"] in solvers and pred(r)]


def summary(rows, solver):
    mine = [r for r in rows if r["solver"] == solver]
    return {"runs": len(mine), "solved": sum(bool(r["solved"]) for r in mine),
            "sgm": stats.shifted_geomean(stats.charged_time(r) for r in mine),
            "pint": statistics.fmean([r["primal_integral"] for r in mine if r["primal_integral"] is not None] or [math.nan]),
            "worse": sum(1 for r in mine if r["amp_opt_s"] is not None and r["amp_opt_s"] > best_value(rows, r) * (1 + 1e-5)),
            "noplan": sum(1 for r in mine if r["amp_opt_s"] is None and best_value(rows, r) is not None)}


_BEST: dict = {}


def best_value(rows, r):
    key = id(rows)
    if key not in _BEST:
        _BEST[key] = stats.reference_values(rows)
    return _BEST[key].get(r["instance"])


def ablation_table(rows, groups):
    print("| switched off | instances | solved (full -> off) | change | SGM time s (full -> off) | ratio | "
          "mean primal integral s (full -> off) | worse plan at the end | no plan at the end |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, pred in groups:
        part = [r for r in rows if pred(r)]
        if not part:
            continue
        full = summary(part, "cpsat")
        for solver, what in ABLATIONS:
            off = summary(part, solver)
            if not off["runs"]:
                continue
            print(f"| {what} (`{solver}`), {label} | {off['runs']} | {full['solved']} -> {off['solved']} | "
                  f"{off['solved'] - full['solved']:+d} | {fmt(full['sgm'])} -> {fmt(off['sgm'])} | "
                  f"{fmt((off['sgm'] + 1) / (full['sgm'] + 1))} | {fmt(full['pint'])} -> {fmt(off['pint'])} | "
                  f"{off['worse']} | {off['noplan']} |")


def solver_table(rows, solvers):
    print("| solver | runs | solved | SGM time s | mean primal integral s | worse plan at the end | no plan at the end |")
    print("|---|---|---|---|---|---|---|")
    for s in solvers:
        x = summary(rows, s)
        if x["runs"]:
            print(f"| `{s}` | {x['runs']} | {x['solved']} | {fmt(x['sgm'])} | {fmt(x['pint'])} | {x['worse']} | "
                  f"{x['noplan']} |")


def program_pairs(rows, a, b):
    """Programs both variants ran on the same (instance, candidate) and both closed (OPTIMAL or
    INFEASIBLE under its cutoff): seconds and nodes, b against a."""
    progs = defaultdict(dict)
    for r in rows:
        if r["solver"] in (a, b):
            for p in r.get("program_stats") or ():
                progs[r["instance"], p["candidate"]].setdefault(r["solver"], p)
    both, times, nodes, faster, open_a, open_b = 0, [], [], 0, 0, 0
    for (inst, cand), by in progs.items():
        if a in by and b in by:
            pa, pb = by[a], by[b]
            closed_a = pa["status"] in ("OPTIMAL", "INFEASIBLE")
            closed_b = pb["status"] in ("OPTIMAL", "INFEASIBLE")
            open_a += not closed_a
            open_b += not closed_b
            if closed_a and closed_b:
                both += 1
                times.append((pb["solver_seconds"] + 0.01) / (pa["solver_seconds"] + 0.01))
                if pa.get("nodes") is not None and pb.get("nodes") is not None:
                    nodes.append((pb["nodes"] + 1) / (pa["nodes"] + 1))
                faster += pb["solver_seconds"] < pa["solver_seconds"]
    gm = (lambda v: math.exp(statistics.fmean(math.log(x) for x in v)) if v else math.nan)
    return {"common": sum(1 for by in progs.values() if a in by and b in by), "both_closed": both,
            "time_ratio": gm(times), "node_ratio": gm(nodes), "b_faster": faster, "open_a": open_a, "open_b": open_b}


def formulation_table(rows):
    print("| prefix variant | assignment variant | solved (prefix / assign) | SGM time s (prefix / assign) | "
          "programs on common candidates | both closed | assign / prefix seconds (geo. mean) | "
          "assign / prefix nodes (geo. mean) | assign faster | left open (prefix / assign) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for a, b in PAIRS:
        sa, sb = summary(rows, a), summary(rows, b)
        if not sa["runs"] or not sb["runs"]:
            continue
        pp = program_pairs(rows, a, b)
        print(f"| `{a}` | `{b}` | {sa['solved']} / {sb['solved']} | {fmt(sa['sgm'])} / {fmt(sb['sgm'])} | "
              f"{pp['common']} | {pp['both_closed']} | {fmt(pp['time_ratio'])} | {fmt(pp['node_ratio'])} | "
              f"{pp['b_faster']} of {pp['both_closed']} | {pp['open_a']} / {pp['open_b']} |")


def large_table(rows, solvers, min_devices=1024):
    print("| instance | GPUs | " + " | ".join(f"`{s}`" for s in solvers) + " |")
    print("|---|---|" + "---|" * len(solvers))
    for inst in dict.fromkeys(r["instance"] for r in rows if r["devices"] >= min_devices):
        by = {r["solver"]: r for r in rows if r["instance"] == inst and r["repeat"] == 0}
        cells = []
        for s in solvers:
            r = by.get(s)
            if r is None:
                cells.append("-")
            elif r["amp_opt_s"] is None:
                cells.append(f"{r['status']} in {r['wall_time']:.0f} s")
            else:
                cells.append(f"{r['status']} {r['amp_opt_s']:.4f} / {fmt(r['bound'], '.4f')} ({fmt(r['gap'], '.2%')}) "
                             f"{r['wall_time']:.0f} s, {r['programs'] or 0} progs")
        print(f"| {inst} | {by[next(iter(by))]['devices']} | " + " | ".join(cells) + " |")


def main(folder: str) -> None:
    doc, rows = load(Path(folder))
    kinds_on = lambda r: r["nodes"] >= 8  # noqa: E731 - phase 1b runs from 8 nodes (KIND_MIN_NODES)
    print(f"From `{folder}/results.json` (command: `{doc['command']}`).\n")
    print("### Per solver\n")
    solver_table(rows, list(dict.fromkeys(r["solver"] for r in rows)))
    print("\n### What each ingredient earns (the full CP-SAT pipeline against each ablation)\n")
    ablation_table(rows, [("all", lambda r: True), ("8+ nodes", kinds_on), ("< 8 nodes", lambda r: not kinds_on(r))])
    print("\n### Prefix against assignment formulation\n")
    formulation_table(rows)
    print("\n### The largest instances: plan / bound (gap), wall time, programs solved\n")
    large_table(rows, [s for s in ("cpsat", "cbc", "highs", "cpsat-nokinds", "highs-nokinds", "cpsat-assign-nokinds",
                                   "highs-assign-nokinds") if any(r["solver"] == s for r in rows)])


if __name__ == "__main__":
    main(sys.argv[1])
