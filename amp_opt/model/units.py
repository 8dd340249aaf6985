"""Unit parsing at the input edge: every quantity becomes SI (bytes, bytes/s, s).

Instance files may write ``"16 GiB"`` or ``"50 Gbit/s"``; this module turns such
strings (and bare numbers, which are already SI) into floats, once, at load time.
"""

from __future__ import annotations

import re

from ..errors import InputError

_BYTES = {
    "b": 1, "byte": 1, "bytes": 1,
    "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
# Rates: bits per second are divided by 8 once, here.
_RATES = {
    "b/s": 1, "kb/s": 1e3, "mb/s": 1e6, "gb/s": 1e9, "tb/s": 1e12,
    "kib/s": 2**10, "mib/s": 2**20, "gib/s": 2**30,
    "bit/s": 1 / 8, "kbit/s": 1e3 / 8, "mbit/s": 1e6 / 8, "gbit/s": 1e9 / 8, "tbit/s": 1e12 / 8,
    "bps": 1 / 8, "kbps": 1e3 / 8, "mbps": 1e6 / 8, "gbps": 1e9 / 8, "tbps": 1e12 / 8,
}
_QUANTITY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z/]+)\s*$")


def _parse(value, table: dict[str, float], field: str, what: str) -> float:
    if isinstance(value, bool):
        raise InputError(field, f"expected {what}, got {value!r}")
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        match = _QUANTITY.match(value)
        if not match or match.group(2).lower() not in table:
            units = ", ".join(sorted({k for k in table}))
            raise InputError(field, f"cannot read {value!r} as {what} (a number, or a number with one of: {units})")
        number = float(match.group(1)) * table[match.group(2).lower()]
    else:
        raise InputError(field, f"expected {what}, got {type(value).__name__}")
    if not number > 0 or number == float("inf"):
        raise InputError(field, f"must be positive and finite, got {value!r}")
    return number


def parse_bytes(value, field: str) -> float:
    """Bytes from a number (bytes) or a string such as ``"16 GiB"``."""
    return _parse(value, _BYTES, field, "a size in bytes")


def parse_bandwidth(value, field: str) -> float:
    """Bytes per second from a number (bytes/s) or a string such as ``"50 Gbit/s"``."""
    return _parse(value, _RATES, field, "a bandwidth in bytes/s")
