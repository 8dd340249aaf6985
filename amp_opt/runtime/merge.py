"""Put measured profiles into an instance document (the ``profiles`` section ``profile`` writes)."""

from __future__ import annotations

from typing import Mapping, Sequence

from .profile import ProfileResult


def merge_profiles(document: Mapping, results: Sequence[ProfileResult | Mapping], *, extras: bool = False) -> dict:
    """A copy of an instance document whose ``profiles`` hold the new measurements.

    Entries with the same (device_type, tp, micro_batch) are replaced; out-of-memory
    results are not entries (nothing was measured) and are skipped.  With
    ``extras=False`` only the schema's fields are written (device_type, tp,
    micro_batch, layer_times), so the document loads with the current schema.

    Examples
    --------
    >>> doc = {"profiles": [{"device_type": "cpu", "tp": 1, "micro_batch": 1, "layer_times": [1.0]}]}
    >>> new = {"device_type": "cpu", "tp": 1, "micro_batch": 1, "layer_times": [0.5]}
    >>> merge_profiles(doc, [new])["profiles"][0]["layer_times"]
    [0.5]
    """
    import copy

    out = copy.deepcopy(dict(document))
    entries = []
    for r in results:
        entry = r.to_json() if isinstance(r, ProfileResult) else dict(r)
        if entry.get("oom"):
            continue
        if not extras:
            entry = {k: entry[k] for k in ("device_type", "tp", "micro_batch", "layer_times")}
        entries.append(entry)
    keys = {(e["device_type"], e["tp"], e.get("micro_batch", 1)) for e in entries}
    kept = [p for p in out.get("profiles", []) if (p["device_type"], p["tp"], p.get("micro_batch", 1)) not in keys]
    out["profiles"] = kept + entries
    return out
