"""Command-line interface: ``python -m amp_opt`` / ``amp-opt``.

Exit codes: 0 success, 2 bad input (the message names the field), 3 infeasible
(the message says why).  User mistakes never print a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

from .errors import AmpOptError, InputError


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def _add_cost_model(p: argparse.ArgumentParser) -> None:
    from .cost import COST_MODELS

    p.add_argument("--cost-model", choices=COST_MODELS, default="hetero",
                   help="hetero: per-device speeds, slowest links, memory limits (default); amp: the AMP paper's model")


def build_parser() -> argparse.ArgumentParser:
    from .placement import PLACEMENTS
    from .solver import SOLVERS

    parser = argparse.ArgumentParser(
        prog="amp-opt",
        description="Plan tensor/data/pipeline-parallel training on heterogeneous GPU clusters.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("solve", help="find the fastest plan of an instance")
    p.add_argument("instance", help="instance JSON file")
    p.add_argument("--solver", choices=SOLVERS, default="auto",
                   help="auto (default): the exact enumerator, or CP-SAT when free grouping is too large to enumerate")
    _add_cost_model(p)
    p.add_argument("--placement", choices=PLACEMENTS, default=None,
                   help="free: the solver groups devices into stages (default under hetero); "
                        "rank-order: Megatron/DeepSpeed rank order (default under amp)")
    p.add_argument("--top-k", type=_positive_int, default=1, metavar="K", help="also report the K best plans")
    p.add_argument("--time-limit", type=_positive_float, default=None, metavar="S", help="seconds for the whole search")
    p.add_argument("--seed", type=int, default=0, help="solver random seed (MIP solvers)")
    p.add_argument("--workers", type=_positive_int, default=1, help="solver threads (MIP solvers; default 1 for repeatable runs)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the report")

    p = sub.add_parser("evaluate", help="score one plan or a list of plans")
    p.add_argument("instance", help="instance JSON file")
    p.add_argument("plan", help="JSON file with a plan object or a list of plans")
    _add_cost_model(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of the report")

    p = sub.add_parser("generate", help="write a random heterogeneous instance (deterministic for a seed)")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--nodes", type=_positive_int, default=4)
    p.add_argument("--devices-per-node", type=_positive_int, default=4)
    p.add_argument("--device-types", type=_positive_int, default=2)
    p.add_argument("--layers", type=_positive_int, default=8, help="entries of the layer list (>= 3)")
    p.add_argument("--global-batch", type=_positive_int, default=16)
    p.add_argument("-o", "--output", required=True, help="instance file to write ('-' for stdout)")

    # Further commands live in their own modules: each has add_parser(subparsers),
    # which registers its parser with set_defaults(run=function).
    for name in EXTRA_COMMANDS:
        importlib.import_module(f".{name}", __package__).add_parser(sub)
    return parser


def _cmd_solve(args) -> int:
    from .instance import load_instance
    from .solver import solve

    instance = load_instance(args.instance)
    progress = None if args.json else _progress_printer()
    result = solve(instance, solver=args.solver, cost_model=args.cost_model, placement=args.placement,
                   top_k=args.top_k, time_limit=args.time_limit, seed=args.seed, workers=args.workers,
                   progress=progress)
    if args.json:
        print(json.dumps(result.to_json(instance, with_top=args.top_k > 1), indent=2))
    else:
        from .report import print_solve

        print_solve(instance, result, show_top=args.top_k > 1)
    return 0


def _cmd_evaluate(args) -> int:
    from .cost import evaluate
    from .instance import load_instance, load_json
    from .plan import load_plans

    instance = load_instance(args.instance)
    plans, is_list = load_plans(load_json(args.plan, "plan"), "plan")
    results = [evaluate(instance, plan, args.cost_model) for plan in plans]
    if args.json:
        out = [r.to_json(instance) for r in results]
        print(json.dumps(out if is_list else out[0], indent=2))
    else:
        from .report import _console, print_evaluation

        console = _console()
        for r in results:
            print_evaluation(instance, r, console)
    return 0


def _cmd_generate(args) -> int:
    from .generate import generate_instance
    from .instance import parse_instance

    doc = generate_instance(args.seed, args.nodes, args.devices_per_node, args.device_types, args.layers,
                            args.global_batch)
    parse_instance(doc)  # generated instances must always validate
    write_text(json.dumps(doc, indent=1) + "\n", args.output)
    return 0


def write_text(text: str, output: str | None, option: str = "--output") -> None:
    """Write command output to a file, or to stdout when ``output`` is None or '-'."""
    if output in (None, "-"):
        sys.stdout.write(text)
        return
    try:
        with open(output, "w") as fh:
            fh.write(text)
    except OSError as exc:
        raise InputError(option, f"cannot write {output}: {exc.strerror}") from None


def _progress_printer():
    """A callback that shows progress on stderr once a search has run for a second."""
    import time

    start = time.perf_counter()
    state = {"last": 0.0}

    def report(done: int, total: int) -> None:
        now = time.perf_counter() - start
        if now > 1.0 and (now - state["last"] > 0.5 or done == total) and sys.stderr.isatty():
            state["last"] = now
            end = "\n" if done == total else "\r"
            print(f"searching: {done}/{total} candidates, {now:.1f} s", end=end, file=sys.stderr, flush=True)

    return report


COMMANDS = {"solve": _cmd_solve, "evaluate": _cmd_evaluate, "generate": _cmd_generate}
# Modules that add a command (see build_parser).
EXTRA_COMMANDS: list[str] = ["export", "plot", "explain", "bench"]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # usage errors exit with status 2
    try:
        run = getattr(args, "run", None) or COMMANDS[args.command]
        return run(args)
    except AmpOptError as exc:
        kind = "infeasible" if exc.exit_code == 3 else "error"
        print(f"amp-opt: {kind}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("amp-opt: interrupted", file=sys.stderr)
        return 130


__all__ = ["main", "build_parser", "InputError"]
