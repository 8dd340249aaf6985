"""Readable reports of evaluations and solve results (rich tables on stdout)."""

from __future__ import annotations

import io
import sys

from rich import box
from rich.console import Console
from rich.table import Table

from ..model.costs import cost_model
from ..model.evaluate import Evaluation
from ..model.plan import describe, partition_text
from ..search.result import SolveResult

GIB = 2**30
TERM_LABELS = {
    "pipeline_bottleneck": "(n-1) x slowest stage",
    "stage_compute": "sum of stage times (fill/drain)",
    "p2p": "pipeline p2p",
    "allreduce": "largest gradient allreduce",
}


TERMINAL_WIDTH = 130  # columns of the report on a terminal
PIPE_WIDTH = 10_000  # on a pipe or file: wide enough that nothing wraps


class Report(Console):
    """A rich console that writes plain lines: no trailing spaces, and, when stdout is not a
    terminal, no wrapping and no colour.  Each ``print`` goes out at once, line by line."""

    def __init__(self, file=None):
        self._out = file or sys.stdout
        tty = self._out.isatty()
        super().__init__(file=io.StringIO(), width=TERMINAL_WIDTH if tty else PIPE_WIDTH, highlight=False,
                         soft_wrap=not tty, force_terminal=tty, no_color=not tty)

    def print(self, *args, **kwargs) -> None:
        with self.capture() as captured:
            super().print(*args, **kwargs)
        text = "\n".join(line.rstrip() for line in captured.get().split("\n"))
        self._out.write(text)


def make_console() -> Console:
    return Report()


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def _groups(groups) -> str:
    """Compact device list: 0-3 for runs, groups joined by spaces."""
    parts = []
    for group in groups:
        group = list(group)
        if len(group) > 1 and group == list(range(group[0], group[0] + len(group))):
            parts.append(f"{group[0]}-{group[-1]}")
        else:
            parts.append(",".join(map(str, group)))
    text = " ".join(parts)
    return text if len(text) <= 40 else text[:37] + "..."


def micro_batches_text(n_micro) -> str:
    """An evaluation's micro-batches per iteration: ``8``, or one count per pipeline, ``5+3``."""
    return str(n_micro) if isinstance(n_micro, int) else "+".join(map(str, n_micro))


def evaluation_tables(instance, ev: Evaluation):
    """The stage table and the breakdown table of one evaluation."""
    plan = ev.plan
    title = (
        f"{describe(plan)}  "
        f"({micro_batches_text(ev.n_micro)} micro-batches/iteration, cost model {ev.cost_model})"
    )
    stages = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    # Where the layer times come from, shown when some stage's were not all measured.
    sources = any(r.compute_source != "measured" for r in ev.stages)
    for col, justify in [("pipeline.stage" if ev.pipelines else "stage", "right"), ("layers", "left"),
                         ("first..last", "left"), ("types", "left"), ("devices", "left"), ("compute ms", "right"),
                         ("p2p ms", "right"), ("allreduce ms", "right"), ("mem GiB", "right"), ("cap GiB", "right")] + \
            ([("times", "left")] if sources else []):
        wide = col in ("first..last", "devices")
        stages.add_column(col, justify=justify, no_wrap=wide, overflow="ellipsis", max_width=28 if wide else None,
                          min_width=len(col))
    for r in ev.stages:
        a, b = r.layers
        names = instance.layers[a].name if b - a == 1 else f"{instance.layers[a].name}..{instance.layers[b - 1].name}"
        mem = f"{r.memory / GIB:.2f}" + ("" if r.fits else " !")
        label = str(r.index) if r.pipeline is None else f"{r.pipeline}.{r.index}"
        stages.add_row(label, f"{a}-{b - 1}", names, ", ".join(r.device_types), _groups(r.groups),
                       _ms(r.compute), _ms(r.p2p), _ms(r.allreduce), mem, f"{r.capacity / GIB:.2f}",
                       *([r.compute_source] if sources else []))

    terms = Table(title=f"predicted time per iteration: {ev.predicted_time:.4f} s", title_justify="left",
                  box=box.SIMPLE_HEAD)
    terms.add_column("term")
    terms.add_column("seconds", justify="right")
    terms.add_column("share", justify="right")
    for key, value in sorted(ev.breakdown.items(), key=lambda kv: -kv[1]):
        share = value / ev.predicted_time if ev.predicted_time > 0 else 0.0
        terms.add_row(_term_label(key, ev), f"{value:.4f}", f"{share:.1%}")
    return stages, terms


def _term_label(key: str, ev: Evaluation) -> str:
    """A breakdown term's label; the bottleneck's says how the cost model weighs it (H6 or H13)."""
    if key == "pipeline_bottleneck" and ev.plan.virtual_stages == 1 and cost_model(ev.cost_model).schedule == "1f1b":
        return "largest 1F1B-weighted stage"
    if key == "p2p" and ev.plan.virtual_stages == 1 and cost_model(ev.cost_model).schedule == "1f1b":
        return "pipeline p2p (both ways)"
    return TERM_LABELS.get(key, key)


def usage_line(instance, ev: Evaluation) -> str:
    """Devices used, price per iteration and per hour (when every used type has a price), MFU."""
    parts = [f"devices used: {ev.devices_used} of {instance.num_devices}"]
    if ev.cost is not None:
        rate = ev.cost / ev.predicted_time * 3600.0 if ev.predicted_time > 0 else 0.0
        parts.append(f"cost: ${ev.cost:.4g} per iteration (${rate:,.2f}/h)")
    if ev.mfu is not None:
        parts.append(f"model FLOPs utilisation: {ev.mfu:.1%}")
    return "; ".join(parts)


def print_evaluation(instance, ev: Evaluation, out: Console | None = None) -> None:
    console = out or make_console()
    stages, terms = evaluation_tables(instance, ev)
    console.print(stages)
    console.print(terms)
    console.print(usage_line(instance, ev))
    verdict = "feasible" if ev.feasible else "INFEASIBLE"
    ignores = "" if cost_model(ev.cost_model).enforces_memory else f" (the {ev.cost_model} cost model ignores memory)"
    console.print(verdict + ignores)
    for v in ev.violations:
        console.print(f"  memory: {v}")
    for note in ev.notes:
        console.print(f"  note: {note}")


def print_solve(instance, result: SolveResult, show_top: bool = False) -> None:
    out = make_console()
    s = result.solver
    out.print(f"[bold]{instance.name}[/bold]: {instance.num_devices} devices on {len(instance.nodes)} nodes, "
              f"{instance.num_layers} layers, global batch {instance.training.global_batch}")
    for note in instance.notes:
        out.print(f"note: {note}")
    print_evaluation(instance, result.best, out)
    extra = ", ".join(f"{k} {v}" for k, v in s.extra.items())
    unit = "USD" if s.extra.get("objective") == "cost" else "s"
    status = f"{s.status} within {s.within}" if s.within else s.status
    out.print(f"solver {s.name}: {status} in {s.wall_time:.3f} s; objective {s.objective:.6g} {unit}, "
              f"bound {s.bound:.6g} {unit}, gap {s.gap:.2%}" + (f"; {extra}" if extra else ""))
    if show_top and len(result.top) > 1:
        out.print(top_table(result))


def top_table(result: SolveResult):
    """The best plans, one row each: every degree and setting (``describe``: interleaving, ZeRO,
    recomputation, ...), the GPUs used, the partition, where each stage runs (plans may differ
    only there) and the time."""
    table = Table(title="best plans", title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("#", "plan", "GPUs", "partition", "stages on", "time s", "vs best"):
        table.add_column(col, justify="left" if col in ("plan", "partition", "stages on") else "right")
    best = result.top[0].predicted_time
    for i, ev in enumerate(result.top):
        table.add_row(str(i + 1), describe(ev.plan), str(ev.devices_used), partition_text(ev.plan),
                      " | ".join(_stage_place(r) for r in ev.stages),
                      f"{ev.predicted_time:.4f}", f"{ev.predicted_time / best:.3f}x")
    return table


def _stage_place(report) -> str:
    """A stage's devices in a few characters: their count and types, and the devices' ids."""
    devices = sorted(d for group in report.groups for d in group)
    return f"{len(devices)} {'+'.join(report.device_types)} {_ranges(devices)}"


def _ranges(ids: list[int]) -> str:
    """Device ids as runs: [0, 1, 2, 5] -> "0-2,5"."""
    runs: list[list[int]] = []
    for d in ids:
        if runs and d == runs[-1][1] + 1:
            runs[-1][1] = d
        else:
            runs.append([d, d])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
