"""What the commands share: argument types, common options, and reading and writing files.

Every command module imports from here, never from :mod:`.cli` or from another command.
"""

from __future__ import annotations

import argparse
import sys
import time

from ..errors import InputError
from ..model.costs import COST_MODELS
from ..model.fields import whole_number
from ..model.load import load_json
from ..model.plan import Plan, parse_plan


def positive_float(text: str) -> float:
    """argparse type: a positive number (seconds, for time limits)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """argparse type: a positive integer."""
    try:
        return whole_number(int(text), "")
    except (ValueError, InputError):
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None


def add_cost_model(parser: argparse.ArgumentParser, what: str = "") -> None:
    """The ``--cost-model`` option, the same on every command."""
    names = "; ".join(f"{m.name}: {m.description}" for m in COST_MODELS.values())
    parser.add_argument("--cost-model", choices=list(COST_MODELS), default="hetero",
                        help=(what + ". " if what else "") + names + " (default: hetero)")


def add_plugins(parser: argparse.ArgumentParser) -> None:
    """The repeatable ``--plugin MODULE`` option (``solve`` and ``bench``)."""
    parser.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                        help="import MODULE (from the current directory or the Python path, or a .py file) "
                             "first: it registers solvers with amp_opt.register_solver (repeatable; default: none)")


def add_torch_options(parser: argparse.ArgumentParser) -> None:
    """``--threads``, ``--dtype`` and ``--attention``: how the PyTorch processes run (``profile`` and
    ``run``, the same on both)."""
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="torch threads per process (CPU default: usable cores / devices per node)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                        help="default: the model's dtype_bytes (4: float32, 2: bfloat16)")
    parser.add_argument("--attention", choices=("eager", "flash"), default=None,
                        help="attention kernel (default: the model's attention setting)")


def load_plugins(modules) -> list[str]:
    """Import every ``--plugin`` module; return the solver names they registered (InputError on failure)."""
    from ..search.registry import load_plugin

    names = []
    for module in modules or ():
        names += load_plugin(module)
    return names


def load_single_plan(path: str) -> Plan:
    """Read a PLAN file holding exactly one plan object."""
    data = load_json(path, "plan")
    if isinstance(data, list):
        raise InputError("plan", "this command takes one plan object, got a list")
    return parse_plan(data)


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


def write_json_document(document: dict, output: str, *, source: str) -> None:
    """Write an instance document derived from the file ``source`` to ``output``, keeping a
    relative ``model.hf_config`` path pointing at the same file from the new folder."""
    import json
    import os
    from pathlib import Path

    config = document.get("model", {}).get("hf_config")
    if isinstance(config, str) and not Path(config).is_absolute():
        document = dict(document, model=dict(document["model"], hf_config=os.path.relpath(
            Path(source).parent / config, Path(output).parent)))
    write_text(json.dumps(document, indent=2) + "\n", output)


def progress_printer():
    """A callback that shows progress on stderr once a search has run for a second."""
    start = time.perf_counter()
    state = {"last": 0.0}

    def report(done: int, total: int) -> None:
        now = time.perf_counter() - start
        if now > 1.0 and (now - state["last"] > 0.5 or done == total) and sys.stderr.isatty():
            state["last"] = now
            end = "\n" if done == total else "\r"
            print(f"searching: {done}/{total} candidates, {now:.1f} s", end=end, file=sys.stderr, flush=True)

    return report
