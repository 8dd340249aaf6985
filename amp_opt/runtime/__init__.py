"""Measure on real hardware with PyTorch: build the instance's model, profile its
layers, and execute a plan (tensor, data and pipeline parallel) on local processes.

Importing this package does not import PyTorch; its submodules do, and raise
:class:`amp_opt.errors.InputError` ('PyTorch is not installed: ...') without it.
The names below are imported on first use::

    from amp_opt.runtime import profile_model, run_plan
"""

from __future__ import annotations

from .._lazy import lazy_exports

_EXPORTS = {
    "require_torch": "_torch",
    "model_shape": "modules",
    "build_model": "modules",
    "build_layer": "modules",
    "ProfileResult": "profile",
    "profile_model": "profile",
    "merge_profiles": "merge",
    "saved_activation_bytes": "memory",
    "run_plan": "run",
    "build_run_task": "run",
    "compare_run": "compare",
    "measure_links": "links",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
