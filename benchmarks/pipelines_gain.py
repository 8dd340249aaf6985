"""Several pipelines, one per GPU type, against the searched plan of one pipeline, in-model.

Usage (from the project root):

    python benchmarks/pipelines_gain.py > benchmarks/results/pipelines_gain.md
    python benchmarks/pipelines_gain.py --time-limit 10 --only g0064    # a quick run

The searches do not enumerate plans of several pipelines (formulations/exactness.md, X6). This
measures what the simplest such plans give under amp_opt's own model (formulations/hetero.md,
U6): every GPU type runs a pipeline of its own on its nodes. For each instance (the generated
suite's 64- and 128-GPU clusters of 2-4 types, the AMP paper's heterogeneous cluster and the
docs' GPT 1.3B on A100s and V100s), with ``search.engine`` "amp_opt":

1. ``solve`` the whole instance (the best plan of one pipeline, ``--time-limit T``);
2. per GPU type, ``solve`` its nodes alone on the whole batch B (cp 1, ZeRO 0, no interleaving:
   what U6 prices), which gives its throughput B / T_t; a type whose nodes cannot hold the
   model alone gets no pipeline;
3. split the batch over the types in proportion to those throughputs (whole samples), solve
   each type's nodes on its share, join the plans as one plan of several pipelines and price it
   with ``evaluate``; then move samples from the pipeline with the longest time to the one with
   the shortest, B/8 at a time, halving the step whenever a move does not lower the priced time,
   down to one sample, keeping the fastest plan priced.

The pipelines plan is a constructed one, not a searched optimum: the table reports its time
against the one-pipeline plan's, (one - several) / one, positive where the pipelines are faster.
Every solve runs in this process (``amp_opt.solve``, same time limit).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import amp_opt  # noqa: E402
from amp_opt.bench.writers import commit as git_commit, machine_info  # noqa: E402
from amp_opt.errors import AmpOptError  # noqa: E402
from amp_opt.model.plan import describe, parse_plan  # noqa: E402


def instances(only: str | None) -> list[Path]:
    gen = [p for p in sorted((ROOT / "instances/suite/gen").glob("*.json"))
           if 2 <= len(json.loads(p.read_text())["device_types"]) <= 4 and int(p.stem[1:5]) <= 128]
    paths = gen + [ROOT / "instances/amp_het_cluster.json", ROOT / "docs/hetero/gpt_two_types.json"]
    if only:
        paths = [p for p in paths if any(word in p.stem for word in only.split(","))]
    return paths


def amp_engine(instance):
    return dataclasses.replace(instance, search=dataclasses.replace(instance.search, engine="amp_opt"))


def of_type(instance, kind: str, batch: int):
    """The instance on the nodes of one GPU type, with ``batch`` samples, in U6's settings."""
    search = dataclasses.replace(instance.search, cp=(1,), zero_stages=(0,), virtual_stages=(1,))
    nodes = tuple(n for n in instance.nodes if n.device_type == kind)
    return dataclasses.replace(instance, nodes=nodes, search=search,
                               training=dataclasses.replace(instance.training, global_batch=batch))


def first_devices(instance, kind: str) -> list[int]:
    """The whole instance's first device id of each node of a type, in node order."""
    return [instance.node_first_device[j] for j, n in enumerate(instance.nodes) if n.device_type == kind]


def solve_type(instance, kind: str, batch: int, limit: float):
    """The best plan of one type's nodes on ``batch`` samples, or None (none fits, or none found)."""
    if batch < 1:
        return None
    try:
        return amp_opt.solve(of_type(instance, kind, batch), time_limit=limit).best
    except AmpOptError:
        return None


def joined(instance, kinds, plans) -> dict:
    """The plan of several pipelines: each type's plan, its device ids moved to the whole instance's."""
    out = []
    for kind, best in zip(kinds, plans):
        sub = of_type(instance, kind, best.plan.pipeline_micro_batch)
        firsts, local_first = first_devices(instance, kind), sub.node_first_device
        node_of = sub.device_node

        def moved(d):
            j = int(node_of[d])
            return firsts[j] + d - local_first[j]

        doc = best.plan.to_json()
        doc["stages"] = [[[moved(d) for d in g] for g in stage] for stage in doc["stages"]]
        doc["micro_batches"] = best.n_micro
        out.append(doc)
    return {"pipelines": out}


def split(batch: int, rates: list[float]) -> list[int]:
    """Whole samples in proportion to ``rates``, summing to ``batch`` (largest remainders)."""
    raw = [batch * r / sum(rates) for r in rates]
    out = [int(x) for x in raw]
    for i in sorted(range(len(raw)), key=lambda i: out[i] - raw[i])[:batch - sum(out)]:
        out[i] += 1
    return out


def several(instance, limit: float):
    """(seconds, plan doc) of the fastest split priced (step 3 of the module docstring), or (None, reason)."""
    batch = instance.training.global_batch
    kinds = sorted({n.device_type for n in instance.nodes})
    solved: dict = {}

    def plan_of(kind: str, b: int):
        if (kind, b) not in solved:
            solved[kind, b] = solve_type(instance, kind, b, limit)
        return solved[kind, b]

    kinds = [k for k in kinds if plan_of(k, batch) is not None]
    if len(kinds) < 2:
        return None, "fewer than two GPU types hold the model alone"

    def price(shares):
        plans = [plan_of(k, b) for k, b in zip(kinds, shares)]
        if any(p is None for p in plans):
            return None
        doc = joined(instance, kinds, plans)
        ev = amp_opt.evaluate(instance, parse_plan(doc))
        return (ev.predicted_time, doc, [p.predicted_time for p in plans]) if ev.feasible else None

    shares = split(batch, [batch / plan_of(k, batch).predicted_time for k in kinds])
    best, step = price(shares), max(1, batch // 8)
    while best is not None and step >= 1:
        bodies = best[2]
        slow, fast = bodies.index(max(bodies)), bodies.index(min(bodies))
        trial = list(shares)
        trial[slow], trial[fast] = trial[slow] - step, trial[fast] + step
        got = price(trial) if trial[slow] >= 1 and slow != fast else None
        if got is not None and got[0] < best[0]:
            best, shares = got, trial
        else:
            step //= 2
    return (best[0], best[1]) if best is not None else (None, "no split found plans that fit on every type")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=20.0, help="seconds per solve (default 20)")
    ap.add_argument("--only", default=None, help="comma-separated words of instance names")
    args = ap.parse_args(argv)
    rows = []
    for path in instances(args.only):
        inst = amp_engine(amp_opt.load_instance(str(path)))
        try:
            one = amp_opt.solve(inst, time_limit=args.time_limit)
        except AmpOptError as exc:  # no plan of one pipeline (proven, or none found in time)
            one = f"exit {exc.exit_code}: {exc}"
        t, doc = several(inst, args.time_limit)
        rows.append((path.stem, inst.num_devices, len({n.device_type for n in inst.nodes}), one, t, doc))
        print(f"{path.stem}: one {one if isinstance(one, str) else one.best.predicted_time} several {t}",
              file=sys.stderr)
    cmd = "python benchmarks/pipelines_gain.py" + (f" --time-limit {args.time_limit:g}" if args.time_limit != 20 else "")
    cmd += f" --only {args.only}" if args.only else ""
    print("# Several pipelines, one per GPU type, against the searched plan of one pipeline\n")
    print(f"Command: `{cmd}` (commit {git_commit(ROOT)})\n")
    print("Machine: " + ", ".join(f"{k} {v}" for k, v in machine_info().items()) + "\n")
    print("Per instance: the one-pipeline plan `solve` finds (engine amp_opt, its status), the plan of one "
          "pipeline per GPU type built as the script's docstring says, priced by `evaluate` (U6), and the gain "
          "(one - several) / one: positive where the pipelines are faster.\n")
    print("| instance | GPUs | types | one pipeline s | status | several pipelines s | gain | pipelines |")
    print("|---|---|---|---|---|---|---|---|")
    wins = compared = 0
    for name, gpus, types, one, t, doc in rows:
        a = one.best.predicted_time if not isinstance(one, str) else None
        first = f"{a:.6f} | {one.solver.status}" if a is not None else f"- | {one}"
        if t is None:
            print(f"| {name} | {gpus} | {types} | {first} | - | - | {doc} |")
            continue
        text = " / ".join(f"{describe(parse_plan({k: v for k, v in p.items() if k != 'micro_batches'}))} "
                          f"x{p['micro_batches']}" for p in doc["pipelines"])
        gain = "-" if a is None else f"{(a - t) / a:+.2%}"
        if a is not None:
            compared += 1
            wins += t < a
        print(f"| {name} | {gpus} | {types} | {first} | {t:.6f} | {gain} | {text} |")
    print(f"\nThe pipelines are faster on {wins} of the {compared} instances with both a plan of one pipeline "
          f"and one of several ({len(rows)} instances).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
