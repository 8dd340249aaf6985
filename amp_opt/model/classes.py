"""Node classes: nodes that are interchangeable for every cost term.

Two nodes are in one class when they have the same device type, device count,
intra- and inter-node bandwidths, NICs and latencies.  The free-grouping DP, the stage-kind search and
the MIPs all aggregate by class (``formulations/mip.md``, eq. M10), and the hetero
bounds by compute class (device type and intra-node link, which is what a layer's
time depends on).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NodeClass:
    """Identical nodes, in instance order."""

    index: int
    device_type: str
    devices: int  # per node
    intra: float  # bytes/s between two devices of a node
    inter: float  # bytes/s of a node's network link
    nodes: tuple[int, ...]
    nics: int | None = None  # the NICs the rings crossing a node share (H17); None: each ring has ``inter``
    intra_latency: float = 0.0  # seconds per message between two devices of a node (H19)
    inter_latency: float = 0.0  # seconds per message on a node's network link (H19)

    def ring_inter(self, tp: int) -> float:
        """Bytes/s of one data-parallel ring leaving a node of the class (eq. H17)."""
        return ring_share(self.inter, self.nics, tp, self.intra)

    @property
    def compute_key(self) -> tuple[str, float, float]:
        """What a layer's time on a group of this class depends on (eq. H2, H19): the device type and
        the group's link, bandwidth and latency."""
        return self.device_type, self.intra, self.intra_latency

    def groups_per_node(self, tp: int) -> int:
        """Tensor-parallel groups of ``tp`` devices one node offers."""
        return self.devices // tp

    def groups(self, tp: int) -> int:
        """Tensor-parallel groups the whole class offers (G_c)."""
        return len(self.nodes) * (self.devices // tp)


def group_nodes(nodes) -> tuple[NodeClass, ...]:
    """Nodes grouped into classes, numbered by first appearance (a pure function of the node list)."""
    members: dict[tuple, list[int]] = {}
    for j, n in enumerate(nodes):
        members.setdefault((n.device_type, n.devices, n.intra_bandwidth, n.inter_bandwidth, n.nics, n.intra_latency,
                            n.inter_latency), []).append(j)
    return tuple(NodeClass(i, *key[:4], tuple(group), *key[4:]) for i, (key, group) in enumerate(members.items()))


def ring_share(inter: float, nics: int | None, tp: int, intra: float = float("inf")) -> float:
    """Bytes/s one of the ``tp`` rings of a stage (one per tensor-parallel rank, reducing at once)
    gets from a node's ``nics`` NICs of ``inter`` bytes/s each (eq. H17): an equal share of all of
    them (a communicator spreads its channels over the node's NICs), at most the node's own link
    ``intra``; ``inter`` whole when the NICs are not stated.

    Examples
    --------
    >>> ring_share(25e9, 8, 1, intra=300e9), ring_share(25e9, 8, 8), ring_share(25e9, 2, 8), ring_share(25e9, None, 4)
    (200000000000.0, 25000000000.0, 6250000000.0, 25000000000.0)
    """
    return inter if nics is None else min(intra, inter * nics / tp)


def node_classes(instance) -> tuple[NodeClass, ...]:
    """The classes of an instance's nodes, numbered by first appearance (computed once per instance).

    Examples
    --------
    >>> from amp_opt import load_instance
    >>> [(c.device_type, c.nodes) for c in node_classes(load_instance("instances/amp_het_cluster.json"))]
    [('V100-16GB', (0, 1, 2)), ('T4', (3,))]
    """
    return instance.node_classes


def class_of_node(instance) -> list[int]:
    """The class index of every node."""
    out = [0] * len(instance.nodes)
    for c in node_classes(instance):
        for j in c.nodes:
            out[j] = c.index
    return out
