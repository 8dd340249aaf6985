"""Per-layer compute time t(layer, device, tp, micro-batch), from measurements or FLOPs.

Measured profiles give forward+backward seconds per layer for one micro-batch
at some micro-batch sizes.  Between measured sizes the time is interpolated
linearly; outside them it is scaled from the nearest measurement as (b / b0) ** beta,
beta the device type's ``batch_exponent`` (1: per sample; calibration C2).  Without a measurement for
the device type and tp degree, the analytic estimate of ``formulations/hetero.md``
(eq. H2) is used:

    t = b ** beta * flops / (tp * peak * efficiency) + 2 (tp-1)/tp * b * tp_comm_bytes / intra_bw

Either is multiplied by the device type's ``compute_scale`` (1 unless calibrated, C1 in
``formulations/calibration.md``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InputError


@dataclass(frozen=True)
class LayerTimes:
    """Seconds per layer for one micro-batch, and whether any came from FLOPs."""

    seconds: np.ndarray
    estimated: bool


def _measured(instance, device_type: str, tp: int) -> list[tuple[int, tuple[float, ...]]]:
    return sorted((p.micro_batch, p.layer_times) for p in instance.profiles if p.device_type == device_type and p.tp == tp)


def _interpolate(measured: list[tuple[int, tuple[float, ...]]], b: int, exponent: float = 1.0) -> np.ndarray:
    """Linear between measured sizes; outside them t(b0) (b / b0) ** exponent from the nearest."""
    sizes = [m for m, _ in measured]
    times = [np.asarray(t, dtype=float) for _, t in measured]
    if b <= sizes[0]:
        return times[0] * (b / sizes[0]) ** exponent
    if b >= sizes[-1]:
        return times[-1] * (b / sizes[-1]) ** exponent
    hi = next(i for i, m in enumerate(sizes) if m >= b)
    if sizes[hi] == b:
        return times[hi]
    lo = hi - 1
    w = (b - sizes[lo]) / (sizes[hi] - sizes[lo])
    return (1 - w) * times[lo] + w * times[hi]


def _analytic(instance, device_type: str, intra_bw: float, tp: int, b: int) -> np.ndarray:
    dev = instance.device_types[device_type]
    eff = instance.training.analytic_efficiency
    flops = instance.layer_flops
    if dev.peak_flops is None or np.isnan(flops).any():
        first = int(np.flatnonzero(np.isnan(flops))[0]) if np.isnan(flops).any() else None
        missing = (f"layer {instance.layers[first].name!r} has no flops" if first is not None
                   else f"device type {device_type!r} has no peak_flops")
        raise InputError(
            "instance.profiles",
            f"no measured profile for device type {device_type!r} at tp {tp}, and {missing} to estimate it from",
        )
    out = b ** dev.batch_exponent * flops / (tp * dev.peak_flops * eff)
    if tp > 1:
        out = out + 2 * (tp - 1) / tp * b * instance.layer_tp_comm / intra_bw
    return out


def layer_times(instance, device_type: str, intra_bw: float, tp: int, micro_batch: int) -> LayerTimes:
    """Forward+backward seconds of every layer for one micro-batch on one tp group (eq. H2).

    A pure function of the instance; :class:`amp_opt.model.tables.Tables` remembers its results.

    Examples
    --------
    >>> from amp_opt import load_instance
    >>> inst = load_instance("instances/amp_het_cluster.json")
    >>> times = layer_times(inst, "T4", inst.nodes[-1].intra_bandwidth, 1, 1)
    >>> len(times.seconds) == inst.num_layers, times.estimated
    (True, False)
    """
    dev = instance.device_types[device_type]
    measured = _measured(instance, device_type, tp)
    if measured:
        return LayerTimes(dev.compute_scale * _interpolate(measured, micro_batch, dev.batch_exponent), False)
    return LayerTimes(dev.compute_scale * _analytic(instance, device_type, intra_bw, tp, micro_batch), True)
