"""Where a measurement was taken: device, versions, date, threads, dtype."""

from __future__ import annotations

import datetime
import os
import platform

from ._torch import require_torch

torch = require_torch()


def usable_cores() -> int:
    """Cores this process may run on (``os.sched_getaffinity``), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (or the platform's processor string)."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def resolve_device(device: str | None) -> str:
    """``"cuda"`` when available and not given, else ``"cpu"``; validated."""
    from ..errors import InputError

    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise InputError("device", f"must be cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("device", "cuda was asked for but torch.cuda.is_available() is false")
    return device


def device_name(device: str) -> str:
    """Human name of the device: the GPU's name, or the CPU model."""
    if device == "cuda":
        return torch.cuda.get_device_name()
    return cpu_name()


def _gpu_family(spec) -> str:
    """The model token of a catalog GPU ("A100", "T4", "4090") a device name must contain."""
    head = spec.name.split("-")[0]
    return spec.name.split("-")[1] if head == "RTX" else head


def catalog_fields(document) -> dict[str, tuple[str, str]]:
    """Device type name -> (field, catalog GPU name) for the instance document's device types
    that name a ``catalog`` entry (whatever they are called).

    Examples
    --------
    >>> catalog_fields({"device_types": [{"name": "cpu", "memory": 1}, {"name": "mygpu", "catalog": "T4"}]})
    {'mygpu': ('instance.device_types[1].catalog', 'T4')}
    """
    out = {}
    for i, raw in enumerate(document.get("device_types", ()) if isinstance(document, dict) else ()):
        if isinstance(raw, dict) and "catalog" in raw:
            out[raw.get("name")] = (f"instance.device_types[{i}].catalog", raw["catalog"])
    return out


def check_local(type_names, device: str, catalogs: dict[str, tuple[str, str]] | None = None) -> None:
    """Refuse device types that are not this machine's device (:class:`InputError`, exit 2).

    A type that is a catalog GPU, by its name or by its ``catalog`` field (``catalogs``, from
    :func:`catalog_fields`), must be that GPU: on CPU it never is; on CUDA the local device's
    name must carry the GPU's model ("A100", "T4") and its memory be within 10% of the
    catalog's.  Other types ("cpu", "my-gpu" without ``catalog``) are the user's word for this
    machine's device and pass.  The error names the field that made the type a GPU.

    Examples
    --------
    >>> check_local(["cpu"], "cpu")
    >>> check_local(["T4"], "cpu")
    Traceback (most recent call last):
    ...
    amp_opt.errors.InputError: device_type: 'T4' is a GPU (T4) and this machine runs on its CPU; name the CPU's own device type (any name not in the GPU catalog)
    >>> check_local(["mygpu"], "cpu", {"mygpu": ("instance.device_types[0].catalog", "T4")})
    Traceback (most recent call last):
    ...
    amp_opt.errors.InputError: instance.device_types[0].catalog: 'mygpu' is a GPU (T4) and this machine runs on its CPU; drop its catalog field and give its memory, or profile and run it on that GPU
    """
    import re

    from ..errors import InputError
    from ..model import catalog

    for name in type_names:
        field, given = (catalogs or {}).get(name, ("device_type", None))
        try:
            spec = catalog.lookup(name if given is None else given, field)
        except InputError:
            if given is not None:
                raise
            continue
        if device != "cuda":
            fix = ("name the CPU's own device type (any name not in the GPU catalog)" if given is None else
                   "drop its catalog field and give its memory, or profile and run it on that GPU")
            raise InputError(field, f"{name!r} is a GPU ({spec.name}) and this machine runs on its CPU; {fix}")
        local = torch.cuda.get_device_name()
        memory = torch.cuda.get_device_properties(0).total_memory
        family = _gpu_family(spec)
        if not re.search(rf"(?<![A-Za-z0-9]){re.escape(family)}(?![A-Za-z0-9])", local, re.IGNORECASE) or not (
                0.9 * spec.memory_bytes <= memory <= 1.1 * spec.memory_bytes):
            raise InputError(field, f"{name!r} is not this machine's GPU ({local}, {memory / 2**30:.1f} GiB)")


def device_memory(device: str, local_rank: int = 0) -> int | None:
    """Bytes of memory of the GPU a local rank runs on (its total, as the instance's device memory
    counts it); None on CPU, whose processes share the machine's memory."""
    if device != "cuda":
        return None
    return int(torch.cuda.get_device_properties(local_rank % torch.cuda.device_count()).total_memory)


def set_threads(threads: int | None) -> int:
    """Set torch's intra-op threads (default: usable cores) and return the value set."""
    from ..errors import InputError

    if threads is None:
        threads = usable_cores()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise InputError("threads", f"must be a positive integer, got {threads!r}")
    torch.set_num_threads(threads)
    return torch.get_num_threads()


def provenance(device: str, dtype, threads: int, **extra) -> dict:
    """JSON-ready record of the measuring environment.

    Examples
    --------
    >>> provenance("cpu", torch.float32, 2)["threads"]
    2
    """
    return {
        "device": device_name(device),
        "device_kind": device,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "threads": threads,
        "dtype": str(dtype).replace("torch.", ""),
        "host_cores": usable_cores(),
        **extra,
    }
