"""A package's public names imported on first use (PEP 562), so that importing it stays light."""

from __future__ import annotations

import importlib
from typing import Callable


def lazy_exports(package: str, exports: dict[str, str], namespace: dict) -> tuple[Callable, Callable]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: ``exports`` maps each public name to the
    submodule (relative to the package) that defines it; a name is imported on first use and then
    kept in ``namespace`` (the package's ``globals()``), so the next use is an ordinary lookup.

    Examples
    --------
    >>> space = {}
    >>> getattr_, dir_ = lazy_exports("amp_opt", {"InputError": "errors"}, space)
    >>> getattr_("InputError").__name__, "InputError" in space, dir_()
    ('InputError', True, ['InputError'])
    >>> getattr_("nothing")
    Traceback (most recent call last):
    AttributeError: module 'amp_opt' has no attribute 'nothing'
    """

    def __getattr__(name: str):
        if name in exports:
            value = getattr(importlib.import_module(f".{exports[name]}", package), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        """The public names (imported on first use) beside the module's own."""
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
