"""``plot``: a timeline of one 1F1B iteration and the per-stage memory of a plan.

The timeline is a small event simulation driven only by the evaluator's
numbers (stage compute E_s, p2p P_s, allreduce AR_s): forward takes E_s/3 and
backward 2E_s/3, activations and gradients cross a boundary in P_s, and each
stage all-reduces its gradients once its last backward is done.  Its makespan
differs from the cost model's closed formula, so the title shows both.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError
from ..model.evaluate import evaluate, memory_parts
from ..model.load import load_instance
from ..model.plan import describe
from .common import add_cost_model, load_single_plan

FORWARD_SHARE = 1.0 / 3.0  # forward : backward = 1 : 2 of each stage's E_s
COLORS = {"F": "#4C8BF5", "B": "#F28C28", "p2pF": "#8E8E8E", "p2pB": "#8E8E8E", "allreduce": "#3BAA5C"}


@dataclass(frozen=True)
class Op:
    """One interval of the simulated schedule."""

    kind: str  # "F", "B", "p2pF"/"p2pB" (activation/gradient arriving at `stage`), "allreduce"
    stage: int
    micro: int  # micro-batch index (-1 for allreduce)
    start: float
    end: float
    after: tuple[str, int, int] | None  # the op whose end fixed this start (kind, stage, micro)


@dataclass(frozen=True)
class Schedule:
    ops: tuple[Op, ...]
    makespan: float
    critical: frozenset  # keys (kind, stage, micro) on the critical path


def one_f_one_b_order(stage: int, pp: int, n: int) -> list[tuple[str, int]]:
    """Non-interleaved 1F1B: min(pp-s-1, n) warm-up forwards, then alternate F/B, then drain backwards."""
    warm = min(pp - stage - 1, n)
    order = [("F", i) for i in range(warm)]
    for i in range(n - warm):
        order += [("F", warm + i), ("B", i)]
    order += [("B", i) for i in range(n - warm, n)]
    return order


def simulate_1f1b(compute, p2p, allreduce, n: int) -> Schedule:
    """Simulate one iteration: per-stage sequential ops, cross-stage dependencies through p2p.

    F(s, i) needs F(s-1, i) plus the transfer P_{s-1}; B(s, i) needs B(s+1, i) plus P_s
    (B of the last stage needs its own F).  Each stage runs its 1F1B order one op at a time,
    then its gradient allreduce.
    """
    pp = len(compute)
    orders = [one_f_one_b_order(s, pp, n) for s in range(pp)]
    pos, free, last = [0] * pp, [0.0] * pp, [None] * pp  # next op, when the stage is free, its last op
    done: dict[tuple[str, int, int], Op] = {}

    def add(op: Op) -> Op:
        done[(op.kind, op.stage, op.micro)] = op
        return op

    def inputs(kind: str, s: int, i: int):
        """(arrival time, key of the op that delivers the input), or None if that op has not run yet."""
        if kind == "F" and s == 0:
            return 0.0, None
        if kind == "B" and s == pp - 1:
            src = done.get(("F", s, i))
            return None if src is None else (src.end, ("F", s, i))
        src_key, link, p2p_kind = (("F", s - 1, i), p2p[s - 1], "p2pF") if kind == "F" else (("B", s + 1, i), p2p[s], "p2pB")
        src = done.get(src_key)
        if src is None:
            return None
        arrival = add(Op(p2p_kind, s, i, src.end, src.end + link, src_key))
        return arrival.end, (p2p_kind, s, i)

    progress = True
    while progress:
        progress = False
        for s in range(pp):
            while pos[s] < len(orders[s]):
                kind, i = orders[s][pos[s]]
                got = inputs(kind, s, i)
                if got is None:
                    break
                t_in, via = got
                start = max(free[s], t_in)
                dur = compute[s] * (FORWARD_SHARE if kind == "F" else 1 - FORWARD_SHARE)
                add(Op(kind, s, i, start, start + dur, via if t_in >= free[s] else last[s]))
                free[s], last[s] = start + dur, (kind, s, i)
                pos[s] += 1
                progress = True
    if any(pos[s] < len(orders[s]) for s in range(pp)):
        raise RuntimeError("1F1B simulation deadlocked")  # cannot happen for the 1F1B order
    for s in range(pp):
        add(Op("allreduce", s, -1, free[s], free[s] + allreduce[s], last[s]))
    ops = tuple(done.values())
    end = max(ops, key=lambda o: o.end)
    critical, key = set(), ("allreduce", end.stage, -1)
    while key is not None:
        critical.add(key)
        key = done[key].after
    return Schedule(ops, end.end, frozenset(critical))


def op_key(op: Op) -> tuple[str, int, int]:
    return (op.kind, op.stage, op.micro)


# ---------------------------------------------------------------------------
# Drawing


def _import_pyplot():
    try:
        import matplotlib
    except ImportError:
        raise InputError("plot", 'needs matplotlib: pip install "amp_opt[plot]"') from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def stage_label(instance, report) -> str:
    a, b = report.layers
    return f"stage {report.index}: {'+'.join(report.device_types)}\nlayers {a}-{b - 1}"


def render(instance, evaluation, path: str) -> Schedule:
    """Draw the timeline and the memory panel of an evaluation into path (.png or .svg)."""
    if not str(path).lower().endswith((".png", ".svg")):
        raise InputError("-o", f"the output must end in .png or .svg, got {path!r}")
    plt = _import_pyplot()
    from matplotlib.patches import Patch

    stages = evaluation.stages
    pp = len(stages)
    sched = simulate_1f1b([r.compute for r in stages], [r.p2p for r in stages], [r.allreduce for r in stages],
                          evaluation.n_micro)
    height = 2.2 + 0.55 * pp
    fig, (ax, mem) = plt.subplots(2, 1, figsize=(14, height + 3.2), gridspec_kw={"height_ratios": [height, 3.2]})
    dense = evaluation.n_micro * pp > 400  # many small boxes: drop the edges, keep the critical outline
    for op in sched.ops:
        y = pp - 1 - op.stage
        on_path = op_key(op) in sched.critical
        if op.kind.startswith("p2p"):
            box = (y - 0.42, 0.16)  # a thin lane under the compute lane
        else:
            box = (y - 0.22, 0.6)
        ax.broken_barh([(op.start, op.end - op.start)], box, facecolors=COLORS[op.kind],
                       edgecolors="black" if on_path else ("none" if dense else "white"),
                       linewidth=1.6 if on_path else 0.3, zorder=3 if on_path else 2)
    ax.set_yticks(range(pp))
    ax.set_yticklabels([stage_label(instance, stages[pp - 1 - y]) for y in range(pp)], fontsize=8)
    ax.set_ylim(-0.6, pp - 0.3)
    ax.set_xlim(0, sched.makespan * 1.01)
    ax.set_xlabel("seconds")
    ax.grid(axis="x", alpha=0.3)
    plan = evaluation.plan
    ax.set_title(
        f"{instance.name}: {describe(plan)}, "
        f"{evaluation.n_micro} micro-batches, 1F1B, cost model {evaluation.cost_model}\n"
        f"iteration time - model: {evaluation.predicted_time:.4f} s, simulated schedule: {sched.makespan:.4f} s",
        fontsize=10, pad=24)
    legend = [Patch(color=COLORS["F"], label="forward (1/3 of E_s)"),
              Patch(color=COLORS["B"], label="backward (2/3 of E_s)"),
              Patch(color=COLORS["p2pF"], label="p2p arrival (thin lane)"),
              Patch(color=COLORS["allreduce"], label="gradient allreduce"),
              Patch(facecolor="white", edgecolor="black", linewidth=1.6, label="critical path (outlined)")]
    ax.legend(handles=legend, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=5, fontsize=8, frameon=False,
              borderaxespad=0.2)

    _memory_panel(mem, instance, evaluation, memory_parts(instance, evaluation))
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise InputError("-o", f"cannot write {path}: {exc.strerror}") from None
    finally:
        plt.close(fig)
    return sched


def _memory_panel(ax, instance, evaluation, parts) -> None:
    """Stacked per-device memory of every stage against each of its device types' capacity."""
    gib = 2**30
    xs = range(len(evaluation.stages))
    bottom = [0.0] * len(parts)
    for name, color in (("model_state", "#7B61FF"), ("activations", "#F2C14E"), ("reserve", "#BBBBBB")):
        values = [getattr(p, name) / gib for p in parts]
        ax.bar(xs, values, bottom=bottom, color=color, width=0.6, label=name.replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, values)]
    types = sorted({t for r in evaluation.stages for t in r.device_types})
    styles = ["-", "--", ":", "-."]
    for k, t in enumerate(types):
        cap = instance.device_types[t].capacity / gib
        for r in evaluation.stages:
            if t in r.device_types:
                ax.hlines(cap, r.index - 0.4, r.index + 0.4, colors="red", linestyles=styles[k % len(styles)],
                          linewidth=1.5, label=f"{t} capacity" if r.index == min(
                              x.index for x in evaluation.stages if t in x.device_types) else None)
    for r in evaluation.stages:
        if not r.fits:
            ax.text(r.index, r.memory / gib, "over", ha="center", va="bottom", color="red", fontsize=8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([f"{r.index}\n{'+'.join(r.device_types)}" for r in evaluation.stages],
                       fontsize=7 if len(parts) > 12 else 8)
    ax.set_ylabel("GiB per device")
    ax.set_title("memory per device by stage (model state + activations + reserve) vs capacity", fontsize=9)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))


# ---------------------------------------------------------------------------
# Command


def add_arguments(p) -> None:
    """The options of the command."""
    p.add_argument("instance", help="instance JSON file")
    p.add_argument("plan", help="JSON file with one plan object")
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="image file to write, .png or .svg (required)")
    add_cost_model(p, "cost model whose terms are drawn")


def run(args) -> int:
    instance = load_instance(args.instance)
    ev = evaluate(instance, load_single_plan(args.plan), args.cost_model)
    sched = render(instance, ev, args.output)
    print(f"wrote {args.output}: model {ev.predicted_time:.4f} s, simulated schedule {sched.makespan:.4f} s")
    return 0
