"""Per-layer compute time t(layer, device, tp, micro-batch), anchored on what was measured.

Three sources, in order of preference (``formulations/hetero.md``, eq. H2 and
"Estimates anchored on measurements"):

* ``measured``: the device type has a profile at this tp degree and micro-batch size;
* ``derived``: the device type has profiles, but not at this (tp, micro-batch).  At a
  measured tp the micro-batch curve of its profiles is followed (linear between measured
  sizes, ``(b / b0) ** beta`` outside them, beta the ``batch_exponent``, eq. A1); at
  another tp the per-layer device-seconds of compute u = tp' * (t - comm) measured at the
  nearest tp degree tp' are kept (the efficiency against the layer's FLOPs does not move),
  along the power law of two measured degrees where there are two, and the model's tp
  communication term is added (eq. A2-A4);
* ``datasheet``: nothing was measured on the device type, so the time is estimated from
  FLOPs at ``training.analytic_efficiency`` of the declared peak:
  ``t = b ** beta * flops / (tp * peak * efficiency) + 2 (tp-1)/tp * b * tp_comm_bytes / intra_bw``
  ``+ 2 (tp-1) * latency * tp_comm_messages`` (the allreduces' ring steps, H19).

Either is multiplied by the device type's ``compute_scale`` (1 unless calibrated, C1 in
``formulations/calibration.md``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import InputError

SOURCES = ("measured", "derived", "datasheet")  # best first: a stage reports the worst of its classes


@dataclass(frozen=True)
class LayerTimes:
    """Seconds per layer for one micro-batch, and where they come from (one of :data:`SOURCES`)."""

    seconds: np.ndarray
    source: str

    @property
    def estimated(self) -> bool:
        """Whether the times came from FLOPs and the datasheet peak (nothing measured on the device type)."""
        return self.source == "datasheet"


def worst_source(sources) -> str:
    """The least measured of some sources (``measured`` < ``derived`` < ``datasheet``).

    Examples
    --------
    >>> worst_source(["measured", "derived"]), worst_source(["measured"])
    ('derived', 'measured')
    """
    return max(sources, key=SOURCES.index)


def _measured(instance, device_type: str, tp: int) -> list[tuple[int, tuple[float, ...]]]:
    return sorted((p.micro_batch, p.layer_times) for p in instance.profiles if p.device_type == device_type and p.tp == tp)


def _interpolate(measured: list[tuple[int, tuple[float, ...]]], b: int, exponent: float = 1.0) -> np.ndarray:
    """Linear between measured sizes; outside them t(b0) (b / b0) ** exponent from the nearest (eq. A1)."""
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


def _tp_comm(instance, intra_bw: float, tp: int, b: int, latency: float) -> np.ndarray:
    """Seconds per layer of the tensor-parallel allreduces of one micro-batch (eq. H2's second term):
    their bytes over the group's link, and each allreduce's 2 (tp-1) ring steps at its latency (H19)."""
    if tp == 1:
        return np.zeros(instance.num_layers)
    return (2 * (tp - 1) / tp * b * instance.layer_tp_comm / intra_bw
            + 2 * (tp - 1) * latency * instance.layer_tp_messages)


def _analytic(instance, device_type: str, intra_bw: float, tp: int, b: int, latency: float) -> np.ndarray:
    dev = instance.device_types[device_type]
    eff = instance.training.analytic_efficiency
    flops = instance.layer_flops
    if dev.peak_flops is None or np.isnan(flops).any():
        first = int(np.flatnonzero(np.isnan(flops))[0]) if np.isnan(flops).any() else None
        missing = (f"layer {instance.layers[first].name!r} has no flops" if first is not None
                   else f"device type {device_type!r} has no peak_flops")
        raise InputError(
            "instance.profiles",
            f"no measured profile for device type {device_type!r}, and {missing} to estimate it from",
        )
    return b ** dev.batch_exponent * flops / (tp * dev.peak_flops * eff) + _tp_comm(instance, intra_bw, tp, b, latency)


def _device_seconds(instance, device_type: str, intra_bw: float, tp: int, b: int, latency: float) -> np.ndarray:
    """u(l, tp, b) = tp * (t - comm): the device-seconds of a layer's compute measured at a measured
    tp degree (eq. A2), the measured time's own tp communication taken off (never below zero)."""
    dev = instance.device_types[device_type]
    t = _interpolate(_measured(instance, device_type, tp), b, dev.batch_exponent)
    return tp * np.maximum(t - _tp_comm(instance, intra_bw, tp, b, latency), 0.0)


def _anchored(instance, device_type: str, intra_bw: float, tp: int, b: int, latency: float,
              degrees: list[int]) -> np.ndarray:
    """A layer time at a tp degree the device type was not measured at (eq. A3-A4): the compute
    device-seconds of the nearest measured degrees, over tp, plus the tp communication at tp."""
    below = [m for m in degrees if m < tp]
    above = [m for m in degrees if m > tp]
    if below and above:  # between two measured degrees: log u linear in log tp
        lo, hi = below[-1], above[0]
    elif len(below) >= 2:  # beyond the largest: the measured trend, only where efficiency falls with tp
        lo, hi = below[-2], below[-1]
    else:  # one measured degree on this side: its efficiency carries over unchanged
        nearest = below[-1] if below else above[0]
        return (_device_seconds(instance, device_type, intra_bw, nearest, b, latency) / tp
                + _tp_comm(instance, intra_bw, tp, b, latency))
    u_lo = _device_seconds(instance, device_type, intra_bw, lo, b, latency)
    u_hi = _device_seconds(instance, device_type, intra_bw, hi, b, latency)
    anchor = u_hi if tp > hi else u_lo
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.log(u_hi / u_lo) / math.log(hi / lo)
    usable = (u_lo > 0) & (u_hi > 0)
    if tp > hi:
        slope = np.maximum(slope, 0.0)  # extrapolated: efficiency never rises past the measured degrees
        base = hi
    else:
        base = lo
    u = np.where(usable, anchor * (tp / base) ** np.where(usable, slope, 0.0), np.where(tp > hi, u_hi, u_lo))
    return u / tp + _tp_comm(instance, intra_bw, tp, b, latency)


def layer_times(instance, device_type: str, intra_bw: float, tp: int, micro_batch: int, *,
                latency: float = 0.0) -> LayerTimes:
    """Forward+backward seconds of every layer for one micro-batch on one tp group (eq. H2, A1-A4).

    ``intra_bw`` (bytes/s) and ``latency`` (seconds per message) are the group's link (H2, H19).
    A pure function of the instance; :class:`amp_opt.model.tables.Tables` remembers its results.

    Examples
    --------
    >>> from amp_opt import load_instance
    >>> inst = load_instance("instances/amp_het_cluster.json")
    >>> times = layer_times(inst, "T4", inst.nodes[-1].intra_bandwidth, 1, 1)
    >>> len(times.seconds) == inst.num_layers, times.source
    (True, 'measured')
    >>> layer_times(inst, "T4", inst.nodes[-1].intra_bandwidth, 8, 1).source  # tp 8 was not measured
    'derived'
    """
    dev = instance.device_types[device_type]
    degrees = sorted({p.tp for p in instance.profiles if p.device_type == device_type})
    if tp in degrees:
        measured = _measured(instance, device_type, tp)
        source = "measured" if any(b == micro_batch for b, _ in measured) else "derived"
        return LayerTimes(dev.compute_scale * _interpolate(measured, micro_batch, dev.batch_exponent), source)
    if degrees:
        return LayerTimes(dev.compute_scale * _anchored(instance, device_type, intra_bw, tp, micro_batch, latency,
                                                        degrees), "derived")
    return LayerTimes(dev.compute_scale * _analytic(instance, device_type, intra_bw, tp, micro_batch, latency),
                      "datasheet")
