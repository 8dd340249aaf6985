"""Every solver configuration that ``solve`` and ``bench`` can run, by name.

One registry for built-in variants and plug-ins alike: ``name -> entry`` with a one-line
description.  A plug-in's ``solve_fn(instance, options)`` returns a
:class:`~amp_opt.search.result.SolveResult`; ``options`` is the validated
:class:`~amp_opt.search.options.SolveOptions` record, which has (at least) the attributes
``cost_model``, ``placement``, ``time_limit``, ``seed`` and ``top_k``.

* A **built-in variant** is a name bound to option values (:attr:`SolverEntry.settings`),
  which :func:`amp_opt.search.solve.run_builtin` runs:
  the engine (``backend``) and the ingredients it switches off or swaps
  (``formulations/variants.md`` lists them with what each one teaches).
* A **plug-in** is a module that calls :func:`register_solver` at import time;
  :func:`load_plugin` imports it (``--plugin MODULE`` on ``solve`` and ``bench``).  Its
  plans are re-scored by the one evaluator (:func:`rescore`): an invalid plan, one that
  does not fit in memory, or a bound above its own plan is a :class:`SolverFailed`.

Example (a whole plug-in file, ``myplug.py``)::

    import amp_opt

    def rank_order(instance, options):
        \"\"\"the exact enumerator restricted to Megatron's rank order\"\"\"
        return amp_opt.solve(instance, solver="enumerate", cost_model=options.cost_model,
                             placement="rank-order", time_limit=options.time_limit, top_k=options.top_k)

    amp_opt.register_solver("rank-order", rank_order)

then ``python -m amp_opt bench --plugin myplug --solvers rank-order,cpsat instances/``.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from ..errors import InputError, SolverFailed
from .result import SAME

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


@dataclass(frozen=True)
class SolverEntry:
    """One registered solver configuration."""

    name: str
    solve_fn: Callable[[Any, Any], Any] | None  # a plug-in's (instance, options) -> SolveResult; None: built-in
    description: str
    settings: Mapping[str, Any] = field(default_factory=dict)  # option values a built-in variant binds
    module: str | None = None  # the plug-in module that registered it (None: built-in)

    @property
    def builtin(self) -> bool:
        return self.module is None


# --------------------------------------------------------------------------- built-in variants

ENGINES = {"cpsat": "OR-Tools CP-SAT", "cbc": "CBC (PuLP's binary)", "highs": "HiGHS (highspy)"}

# suffix, option values, what the variant is (after the engine's name)
VARIANTS: tuple[tuple[str, dict, str], ...] = (
    ("", {}, "the full pipeline: DP incumbents, stage-kind search (phase 1b), per-candidate programs "
             "(prefix layer variables, symmetry rows) warm-started and cut off at the best value known"),
    ("-nokinds", {"kinds": False}, "without phase 1b (the stage-kind bound B4 and its plans): the programs close the gap"),
    ("-nodp", {"incumbents": False}, "without phase 1's DP incumbents: no plan, cutoff or warm start until "
                                     "phase 1b or a program finds one"),
    ("-nowarm", {"warm_start": False}, "the programs start cold: no hint from the best known plan of their candidate"),
    ("-nocutoff", {"cutoffs": False}, "the programs are not cut off at the k-th best value known"),
    ("-nosym", {"symmetry": False}, "without the symmetry rows (M12) between identical nodes"),
    ("-assign", {"layers": "assignment"}, "the second formulation: layer-to-stage assignment variables x[l,s] with "
                                          "textbook contiguity rows (A1-A4) instead of prefix variables Y[s,l]"),
    ("-assign-nokinds", {"layers": "assignment", "kinds": False}, "the assignment formulation without phase 1b"),
)


def _builtins() -> dict[str, SolverEntry]:
    out = {}

    def add(name, settings, description):
        out[name] = SolverEntry(name, None, description, dict(settings))

    add("auto", {"backend": "auto"}, "the exact enumerator, or cpsat when free grouping is too large to enumerate")
    add("enumerate", {"backend": "enumerate"}, "exact enumeration: every candidate, the stage DP over every grouping "
                                               "(ground truth on small instances)")
    for engine, label in ENGINES.items():
        for suffix, settings, what in VARIANTS:
            add(engine + suffix, {"backend": engine, **settings}, f"{label}; {what}")
    return out


BUILTIN: dict[str, SolverEntry] = _builtins()
_PLUGINS: dict[str, SolverEntry] = {}
_loading: list[str] = []  # the plug-in module being imported by load_plugin, if any


def solvers() -> dict[str, SolverEntry]:
    """Every known solver: the built-in variants, then the plug-ins in registration order."""
    return {**BUILTIN, **_PLUGINS}


def lookup(name: str, option: str = "--solver") -> SolverEntry:
    """The entry of a solver name; an unknown name is an InputError listing the known ones."""
    known = solvers()
    if isinstance(name, str) and name in known:
        return known[name]
    hint = "" if _PLUGINS else " (a plug-in's solver needs --plugin MODULE)"
    raise InputError(option, f"unknown solver {name!r}; known solvers: {', '.join(known)}{hint}")


def register_solver(name: str, solve_fn: Callable, description: str | None = None) -> None:
    """Register a solver under ``name`` so that ``solve(..., solver=name)`` and ``bench`` run it.

    ``solve_fn(instance, options)`` must return an :class:`amp_opt.SolveResult`; ``options``
    has at least ``cost_model``, ``placement``, ``time_limit``, ``seed`` and ``top_k``.
    ``description`` (one line) defaults to the first line of ``solve_fn``'s docstring.
    Registering a name again replaces the plug-in; built-in names cannot be replaced.
    """
    if not isinstance(name, str) or not NAME.match(name):
        raise InputError("register_solver", f"solver name must be letters, digits and _.+- "
                                            f"(no commas or spaces), got {name!r}")
    if name in BUILTIN:
        raise InputError("register_solver", f"{name!r} is a built-in solver; choose another name")
    if not callable(solve_fn):
        raise InputError("register_solver", f"solver {name!r}: solve_fn must be callable, got "
                                            f"{type(solve_fn).__name__} {solve_fn!r:.60}")
    if description is None:
        doc = (getattr(solve_fn, "__doc__", None) or "").strip()
        description = doc.splitlines()[0].strip() if doc else ""
    module = _loading[-1] if _loading else getattr(solve_fn, "__module__", None) or "__main__"
    description = " ".join(str(description).split()) or f"plug-in from module {module}"
    _PLUGINS[name] = SolverEntry(name, solve_fn, description, {}, module)


def load_plugin(spec: str) -> list[str]:
    """Import a plug-in module and return the solver names it registered.

    ``spec`` is a module name, found in the current directory or on the Python path, or a
    path to a ``.py`` file.  Any failure (the module is missing, raises while importing,
    registers nothing, or registers a non-callable) is one InputError naming the module.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise InputError("--plugin", f"expected a module name, got {spec!r}")
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)  # "from the current directory", as python -m does
    module_name = Path(spec).stem if spec.endswith(".py") else spec
    _loading.append(module_name)
    try:
        if spec.endswith(".py"):
            module = _import_file(Path(spec), module_name)
        else:
            module = importlib.import_module(spec)
    except InputError as exc:  # from register_solver
        raise InputError("--plugin", f"module {spec!r}: {exc.problem}") from None
    except ModuleNotFoundError as exc:
        if exc.name and (spec == exc.name or spec.startswith(exc.name + ".")):
            raise InputError("--plugin", f"module {spec!r} not found in the current directory or on the "
                                         f"Python path") from None
        raise InputError("--plugin", f"module {spec!r} failed to import: {_one_line(exc)}") from None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - a plug-in's import error is bad input, never a traceback
        raise InputError("--plugin", f"module {spec!r} failed to import: {_one_line(exc)}") from None
    finally:
        _loading.pop()
    names = [n for n, e in _PLUGINS.items() if e.module in (module.__name__, module_name)]
    if not names:
        raise InputError("--plugin", f"module {spec!r} registered no solver (call "
                                     f"amp_opt.register_solver(name, solve_fn) at import time)")
    return names


def _import_file(path: Path, name: str):
    if not path.is_file():
        raise InputError("--plugin", f"module file {str(path)!r} not found")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# --------------------------------------------------------------------------- running and re-scoring

def run_plugin(entry: SolverEntry, instance, options):
    """Call a plug-in and re-score what it returns; its failures become :class:`SolverFailed`."""
    start = time.perf_counter()
    try:
        result = entry.solve_fn(instance, options)
    except (InputError, SolverFailed) as exc:
        raise SolverFailed(f"solver {entry.name!r} (plug-in {entry.module}) failed: {exc}") from None
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        from ..errors import InfeasibleError

        if isinstance(exc, InfeasibleError):  # a plug-in may say it found nothing, as the built-ins do
            raise
        raise SolverFailed(f"solver {entry.name!r} (plug-in {entry.module}) raised {_one_line(exc)}") from None
    return rescore(instance, options, result, entry.name, wall_time=time.perf_counter() - start)


def rescore(instance, options, result, name: str, wall_time: float | None = None):
    """A solver's result with every plan re-scored by the one evaluator, best first.

    The reported objective is the evaluator's score of the best plan (the solver's own
    claim is kept as ``extra["claimed_objective"]`` when it differs); a plan the evaluator
    rejects (invalid, or not fitting in memory) or a bound above the best plan's score is a
    :class:`SolverFailed` naming the solver and the reason.
    """
    from ..model.evaluate import evaluate
    from .result import SolveResult, SolverStats

    if not isinstance(result, SolveResult):
        raise SolverFailed(f"solver {name!r} returned {type(result).__name__}, not an amp_opt.SolveResult")
    stats = result.solver
    if not isinstance(stats, SolverStats):
        raise SolverFailed(f"solver {name!r} returned a SolveResult whose .solver is not an amp_opt.SolverStats")
    plans = [e.plan for e in (result.top or (result.best,))]
    scored = []
    for k, plan in enumerate(plans):
        try:
            ev = evaluate(instance, plan, options.cost_model)
        except InputError as exc:
            raise SolverFailed(f"solver {name!r} returned an invalid plan (#{k + 1}): {exc}") from None
        except Exception as exc:  # a plan that is not even a Plan
            raise SolverFailed(f"solver {name!r} returned an invalid plan (#{k + 1}): {_one_line(exc)}") from None
        if not ev.feasible:
            why = "; ".join(ev.violations) or "it does not fit in memory"
            raise SolverFailed(f"solver {name!r} returned a plan the evaluator rejects (#{k + 1}): {why}")
        scored.append(ev)
    scored.sort(key=lambda e: e.predicted_time)
    best = scored[0].predicted_time
    try:
        claimed_obj, bound = float(stats.objective), float(stats.bound)
    except (TypeError, ValueError):
        raise SolverFailed(f"solver {name!r} reported a non-numeric objective or bound") from None
    if math.isnan(bound) or bound > best * (1 + SAME) + 1e-12:
        raise SolverFailed(f"solver {name!r} claims a lower bound of {bound:.6g} s above its best plan's "
                           f"{best:.6g} s (evaluator)")
    extra = dict(stats.extra)
    if not math.isclose(claimed_obj, best, rel_tol=SAME, abs_tol=1e-12):
        extra["claimed_objective"] = claimed_obj
    status = stats.status if stats.status in ("OPTIMAL", "FEASIBLE") else "FEASIBLE"
    new = dataclasses.replace(stats, name=name, status=status, objective=best, bound=min(bound, best),
                              wall_time=stats.wall_time if wall_time is None else wall_time, extra=extra)
    return SolveResult(scored[0], tuple(scored[:max(1, options.top_k)]), new)


def result_from_plans(instance, plans, options, *, status: str = "FEASIBLE", bound: float = 0.0,
                      name: str | None = None, extra: dict | None = None):
    """A :class:`~amp_opt.search.result.SolveResult` from plans a plug-in found, each scored by
    the evaluator, best first.  ``bound`` is what the plug-in proves (default 0: nothing)."""
    from ..model.evaluate import evaluate
    from .result import SolveResult, SolverStats

    evaluations = sorted((evaluate(instance, p, options.cost_model) for p in plans), key=lambda e: e.predicted_time)
    if not evaluations:
        from ..errors import InfeasibleError

        raise InfeasibleError("no plan given")
    stats = SolverStats(name or getattr(options, "solver", "plugin"), status, 0.0, evaluations[0].predicted_time,
                        bound, dict(extra or {}))
    return SolveResult(evaluations[0], tuple(evaluations[:max(1, options.top_k)]), stats)
