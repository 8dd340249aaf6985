"""An instance's ``calibration`` section, applied to the typed instance (``formulations/calibration.md``).

The section holds named corrections fitted from measured runs (``python -m amp_opt
calibrate``), each entering one equation of the hetero cost model:

* C1 ``compute_scale`` (per device type): layer times x kappa_g (eq. H2);
* C2 ``batch_exponent`` (per device type): time ~ micro_batch ** beta_g away from
  the measured sizes (eq. H2);
* C3 ``step_overhead`` (per device type): seconds every stage spends per
  micro-batch beyond its layers (eq. H1);
* C4 ``links.intra`` / ``links.inter`` (and per device type
  ``intra_bandwidth_factor`` / ``inter_bandwidth_factor``): effective over nominal
  bandwidth (eq. H3, H4);
* C5 ``memory_overhead`` (per device type): bytes the framework takes beyond the
  model's count; the capacity a stage may use is memory - overhead (eq. H5);
* C6 ``activation_factor``: measured over modelled activation bytes (eq. H5, H7);
* C7 ``gradient_buffer_bytes_per_param``: bytes per parameter of the buffers a
  stage with data-parallel replicas allocates for its gradient reduction (eq. H5).
* C8 ``memory_headroom`` (per device type): bytes taken off the capacity because
  runs ran out of memory where the model said they fit; unlike C5 it is no part of
  the predicted peak, so it tightens feasibility without moving any prediction.

Every correction scales a per-layer table, adds a constant or scales a capacity, so
the programs stay linear.  The section is keyed by device type and link kind:
device types it names that an instance lacks are ignored, so it applies unchanged
to any instance with the same hardware.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

DEVICE_FIELDS = ("compute_scale", "batch_exponent", "step_overhead", "memory_overhead", "memory_headroom")  # C1-3, C5, C8
TRAINING_FIELDS = ("activation_factor", "gradient_buffer_bytes_per_param")  # C6, C7


def apply_calibration(instance, section: Mapping[str, Any] | None):
    """The instance with a calibration section's corrections applied (C1-C8).

    ``instance`` must be uncalibrated (its bandwidths nominal): link factors multiply
    the bandwidths it holds.  Device types the section names that the instance does
    not have are ignored.

    Parameters
    ----------
    instance : Instance
    section : mapping or None
        ``{"device_types": {NAME: {...}}, "links": {"intra", "inter"}, "activation_factor",
        "gradient_buffer_bytes_per_param", "fit"}``, as in ``instance.schema.json``.

    Returns
    -------
    Instance

    Examples
    --------
    >>> from amp_opt import load_instance
    >>> inst = load_instance("instances/amp_het_cluster.json")
    >>> cal = apply_calibration(inst, {"device_types": {"T4": {"compute_scale": 1.5}, "H100": {}},
    ...                                "links": {"inter": 0.5}})
    >>> cal.device_types["T4"].compute_scale, cal.nodes[0].inter_bandwidth / inst.nodes[0].inter_bandwidth
    (1.5, 0.5)
    """
    if not section:
        return instance
    per_type = section.get("device_types", {})
    types = {name: replace(t, **{k: float(v) for k, v in per_type.get(name, {}).items() if k in DEVICE_FIELDS})
             for name, t in instance.device_types.items()}
    links = section.get("links", {})

    def link(node):
        own = per_type.get(node.device_type, {})
        intra = float(own.get("intra_bandwidth_factor", links.get("intra", 1.0)))
        inter = float(own.get("inter_bandwidth_factor", links.get("inter", 1.0)))
        return replace(node, intra_bandwidth=node.intra_bandwidth * intra, inter_bandwidth=node.inter_bandwidth * inter)

    training = replace(instance.training, **{k: float(section[k]) for k in TRAINING_FIELDS if k in section})
    return replace(instance, device_types=types, nodes=tuple(link(n) for n in instance.nodes), training=training)
