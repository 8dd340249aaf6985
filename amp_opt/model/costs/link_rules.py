"""The link rules of the hetero terms: which bandwidth and latency a group of devices' messages see.

A group inside one node uses that node's intra-node link; a group across nodes the slowest
inter-node link (H3, H4), a data-parallel ring a share of each node's NICs (H17), and every
message pays the link's latency (H19).  ``formulations/hetero.md`` states each rule.
"""

from __future__ import annotations

from ..classes import ring_share

def tp_link(instance, nodes) -> float:
    """Bytes/s of a tensor-parallel group's collectives (eq. H2, H16): its node's intra-node
    bandwidth, or over the slowest inter-node link of the nodes it spans."""
    return hetero_link(instance, nodes)


def ring_link(instance, nodes, tp: int) -> float:
    """Bytes/s of a stage's data-parallel ring (eq. H4, H17): its node's intra-node link when it
    sits in one, else the slowest share of a NIC any of its nodes gives one of its tp rings."""
    used = set(nodes)
    if len(used) == 1:
        return instance.nodes[next(iter(used))].intra_bandwidth
    nodes = instance.nodes
    return min(ring_share(nodes[j].inter_bandwidth, nodes[j].nics, tp, nodes[j].intra_bandwidth) for j in used)


def hetero_link(instance, nodes) -> float:
    """The hetero model's link rule (eq. H3, H4): intra-node bandwidth when every
    group sits in one node, else the slowest inter-node link among the nodes.

    Examples
    --------
    >>> from amp_opt import load_instance
    >>> inst = load_instance("instances/amp_het_cluster.json")  # nodes 0-2: V100, 3: T4
    >>> hetero_link(inst, [0]), hetero_link(inst, [0, 3])  # bytes/s: NVLink, then 10 Gbit/s
    (21250000000.0, 1250000000.0)
    """
    used = set(nodes)
    if len(used) == 1:
        return instance.nodes[next(iter(used))].intra_bandwidth
    return min(instance.nodes[j].inter_bandwidth for j in used)


def link_latency(instance, nodes) -> float:
    """Seconds per message of the link among ``nodes`` (eq. H19, the link rule of H3, H4): the
    node's intra-node latency when they are one node, else the largest inter-node latency among them."""
    used = set(nodes)
    if len(used) == 1:
        return instance.nodes[next(iter(used))].intra_latency
    return max(instance.nodes[j].inter_latency for j in used)


def allreduce_factor(instance, dp: int, bandwidth: float) -> float:
    """Seconds per parameter (per rank) of a ring allreduce over dp replicas (eq. H4)."""
    return 2 * (dp - 1) / dp * instance.training.allreduce_bytes_per_param / bandwidth
