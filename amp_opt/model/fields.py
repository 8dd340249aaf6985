"""Field checks shared by every reader of user input (instances, plans, presets, options).

One place says what a valid whole number is, so that every message about one reads
the same: ``<field>: must be a positive integer, got <value>``.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import InputError


def whole_number(value: Any, field: str, *, minimum: int = 1) -> int:
    """``value`` if it is an integer (not a bool) of at least ``minimum``, else InputError naming ``field``.

    Examples
    --------
    >>> whole_number(4, "plan.tp")
    4
    >>> whole_number(0, "plan.tp")
    Traceback (most recent call last):
    ...
    amp_opt.errors.InputError: plan.tp: must be a positive integer, got 0
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise InputError(field, f"must be {what}, got {value!r}")
    return value


def number_field(data: Mapping, key: str, where: str, *, default: int | None = None, minimum: int = 1) -> int:
    """The whole number ``data[key]``; ``default`` when it is absent (or null), an error if there is none."""
    if data.get(key) is None:
        if default is None:
            raise InputError(f"{where}.{key}", "is required")
        return default
    return whole_number(data[key], f"{where}.{key}", minimum=minimum)
