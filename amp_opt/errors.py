"""The kinds of user-facing failure, each with its exit code.

The CLI turns these into a one-line message and an exit status; library users
catch them like any exception.  Anything else escaping is a bug in amp_opt.
"""

from __future__ import annotations


class AmpOptError(Exception):
    """Base class of the errors amp_opt raises on purpose."""

    exit_code = 1


class InputError(AmpOptError, ValueError):
    """Malformed instance, plan or option.  The message names the field."""

    exit_code = 2

    def __init__(self, field: str, problem: str):
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}" if field else problem)


class InfeasibleError(AmpOptError):
    """No plan satisfies the constraints.  The message says which one binds."""

    exit_code = 3


class NoPlanFound(AmpOptError):
    """The search stopped (time limit, or a signal) before it found a plan, and before it
    could prove that none exists: not a verdict on the instance.  ``reason`` is the stop;
    ``bound`` what the search proved before it stopped: no plan is faster (seconds; 0: nothing);
    ``proven`` what it proved about the plans it did search, added to the default message."""

    exit_code = 4

    def __init__(self, reason: str, message: str | None = None, *, bound: float = 0.0, proven: str = ""):
        self.reason, self.bound = reason, bound
        if message is None:
            message = (f"no plan found before the {reason}; infeasibility not proven" if reason.startswith("time limit")
                       else f"{reason} before a plan was found; infeasibility not proven")
            message += f"; {proven}" if proven else ""
        super().__init__(message)


class SolverFailed(AmpOptError):
    """A solver (typically a plug-in) raised or returned something the evaluator rejects.

    The benchmark records such a run as FAILED with this message and goes on.
    """

    exit_code = 5


class SearchTooLarge(InputError):
    """The exhaustive search would be too large; a MIP solver should be used instead."""
