"""The one place the runtime imports PyTorch, so a missing install is one clear error."""

from __future__ import annotations

from ..errors import InputError

TORCH_MISSING = 'PyTorch is not installed: pip install "amp_opt[torch]"'


def require_torch():
    """Return the ``torch`` module, or raise :class:`InputError` if it is not installed.

    Examples
    --------
    >>> torch = require_torch()
    """
    try:
        import torch
    except ImportError:
        raise InputError("", TORCH_MISSING) from None
    return torch
