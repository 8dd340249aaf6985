"""``plot``: a timeline of one iteration's pipeline schedule and the per-stage memory of a plan.

The timeline is an event simulation (:func:`amp_opt.model.schedule.simulate`) driven only by
the evaluator's numbers (stage compute E_s, p2p P_s, allreduce AR_s): forward takes E_s/3 and
backward 2E_s/3, activations and gradients cross a boundary in P_s, and each stage
all-reduces its gradients once its last backward is done; with virtual stages, Megatron's
interleaved order over the stage's chunks.  Its makespan differs from the cost model's
closed formula, so the title shows both.
"""

from __future__ import annotations

from ..errors import InputError
from ..model.evaluate import evaluate, memory_parts
from ..model.load import load_instance
from ..model.plan import describe
from ..model.schedule import Schedule, schedule_of
from .common import add_cost_model, load_single_plan
from .report import micro_batches_text

COLORS = {"F": "#4C8BF5", "B": "#F28C28", "p2pF": "#8E8E8E", "p2pB": "#8E8E8E", "allreduce": "#3BAA5C"}


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


def stage_label(instance, report, plan=None) -> str:
    """A stage's lane label: its device types and layers; its own tp, dp and shares when the plan's
    stages or replicas differ."""
    chunks = report.chunks if len(report.chunks) > 1 else (report.layers,)
    ranges = ", ".join(f"{a}-{b - 1}" for a, b in chunks)
    label = f"stage {report.index}: {'+'.join(report.device_types)}\nlayers {ranges}"
    if report.pipeline is not None:  # several pipelines: the stage's own pipeline's degrees
        label, plan = f"pipeline {report.pipeline} {label}", plan.pipelines[report.pipeline]
    if plan is not None and not plan.uniform:
        s = report.index
        label += f"\ntp {plan.tp_at(s)} dp {plan.dp_at(s)} shares {'+'.join(map(str, plan.shares_at(s)))}"
    return label


def render(instance, evaluation, path: str) -> Schedule:
    """Draw the timeline and the memory panel of an evaluation into path (.png or .svg)."""
    if not str(path).lower().endswith((".png", ".svg")):
        raise InputError("-o", f"the output must end in .png or .svg, got {path!r}")
    plt = _import_pyplot()
    from matplotlib.patches import Patch

    stages = evaluation.stages
    pp = len(stages)
    sched = schedule_of(instance, evaluation)
    height = 2.2 + 0.55 * pp
    fig, (ax, mem) = plt.subplots(2, 1, figsize=(14, height + 3.2), gridspec_kw={"height_ratios": [height, 3.2]})
    n = evaluation.n_micro if isinstance(evaluation.n_micro, int) else sum(evaluation.n_micro)
    dense = n * pp > 400  # many small boxes: drop the edges, keep the critical outline
    for op in sched.ops:
        y = pp - 1 - op.stage
        on_path = op.key in sched.critical
        if op.kind.startswith("p2p"):
            box = (y - 0.42, 0.16)  # a thin lane under the compute lane
        else:
            box = (y - 0.22, 0.6)
        ax.broken_barh([(op.start, op.end - op.start)], box, facecolors=COLORS[op.kind],
                       edgecolors="black" if on_path else ("none" if dense else "white"),
                       linewidth=1.6 if on_path else 0.3, zorder=3 if on_path else 2)
    ax.set_yticks(range(pp))
    ax.set_yticklabels([stage_label(instance, stages[pp - 1 - y], evaluation.plan) for y in range(pp)], fontsize=8)
    ax.set_ylim(-0.6, pp - 0.3)
    ax.set_xlim(0, sched.makespan * 1.01)
    ax.set_xlabel("seconds")
    ax.grid(axis="x", alpha=0.3)
    plan = evaluation.plan
    ax.set_title(
        f"{instance.name}: {describe(plan)}, "
        f"{micro_batches_text(evaluation.n_micro)} micro-batches, "
        f"{'interleaved ' if plan.virtual_stages > 1 else ''}1F1B, "
        f"cost model {evaluation.cost_model}\n"
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
    first = {t: min(x for x, r in enumerate(evaluation.stages) if t in r.device_types) for t in types}
    for k, t in enumerate(types):
        cap = instance.device_types[t].capacity / gib
        for x, r in enumerate(evaluation.stages):
            if t in r.device_types:
                ax.hlines(cap, x - 0.4, x + 0.4, colors="red", linestyles=styles[k % len(styles)],
                          linewidth=1.5, label=f"{t} capacity" if x == first[t] else None)
    for x, r in enumerate(evaluation.stages):
        if not r.fits:
            ax.text(x, r.memory / gib, "over", ha="center", va="bottom", color="red", fontsize=8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([f"{'' if r.pipeline is None else f'{r.pipeline}.'}{r.index}\n{'+'.join(r.device_types)}"
                        for r in evaluation.stages],
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
