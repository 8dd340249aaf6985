"""Problem instances: the typed immutable records the rest of amp_opt trusts.

:mod:`amp_opt.model.load` builds them from JSON, validating every field once;
nothing after that re-checks an :class:`Instance`.  Quantities are SI: bytes,
bytes/s, seconds, FLOP/s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Mapping

import numpy as np

from .classes import group_nodes


@dataclass(frozen=True)
class Split:
    """A per-device quantity under tensor parallelism t: ``replicated + sharded / t``.

    With sequence parallelism (activation quantities only) the replicated part is split
    over the t ranks too (Korthikanti et al. 2022, Sec. 4.2.2): ``(replicated + sharded) / t``.
    """

    replicated: float = 0.0
    sharded: float = 0.0

    def at(self, tp: int, sequence_parallel: bool = False) -> float:
        if sequence_parallel:
            return (self.replicated + self.sharded) / tp
        return self.replicated + self.sharded / tp


@dataclass(frozen=True)
class Layer:
    """One entry of the model's ordered layer list (per-sample quantities)."""

    name: str
    kind: str
    params: Split  # parameter count
    activation_bytes: Split  # bytes sent to the next layer per sample
    activation_memory_bytes: Split  # bytes kept for backward per sample
    flops: float | None  # forward+backward FLOPs per sample, all tp ranks together
    tp_comm_bytes: float  # bytes all-reduced in the tp group per sample, fwd+bwd
    tie: str | None = None
    tied_params: float | None = None  # count of the shared tensor, split over tp
    # Only transformer layers recompute (formulations/hetero.md, H7-H8):
    attention_memory_bytes: Split = Split()  # part of activation_memory_bytes selective recompute frees
    attention_flops: float = 0.0  # forward FLOPs of the attention core per sample (selective recomputes it)
    kv_bytes: Split = Split()  # keys and values of one sample (context parallelism exchanges them)
    tp_comm_messages: int = 0  # the tp group's allreduces per micro-batch, fwd+bwd (each 2 (tp-1) ring steps, H19)
    # A block of consecutive layers (:mod:`amp_opt.model.coarsen`) keeps its members, for the
    # terms that are not sums: what full recomputation keeps, the largest member's buffers.
    members: tuple["Layer", ...] = ()

    @property
    def recomputes(self) -> bool:
        """Whether activation recomputation applies to this layer (Megatron: transformer layers)."""
        return self.kind == "transformer"


@dataclass(frozen=True)
class DeviceType:
    """A GPU type.  The last five fields are corrections an instance's ``calibration`` section
    sets (``formulations/calibration.md``); their defaults leave the model as it is."""

    name: str
    memory: float  # bytes
    peak_flops: float | None  # dense fp16/bf16 FLOP/s
    price_per_hour: float | None = None  # USD per device-hour (the cost objective)
    memory_bandwidth: float | None = None  # bytes/s of device memory (the optimizer step, eq. H15); None: unknown
    compute_scale: float = 1.0  # C1: measured / modelled layer time
    batch_exponent: float = 1.0  # C2: time grows as micro_batch ** exponent away from measured sizes
    step_overhead: float = 0.0  # C3: seconds every stage spends per micro-batch beyond its layers
    memory_overhead: float = 0.0  # C5: bytes per device the framework takes beyond the model's count
    memory_headroom: float = 0.0  # C8: bytes per device runs out of memory showed not to be usable

    @property
    def capacity(self) -> float:
        """Bytes a stage may use per device: the memory less the learned overhead (C5) and the
        headroom out-of-memory runs called for (C8)."""
        return self.memory - self.memory_overhead - self.memory_headroom


@dataclass(frozen=True)
class Node:
    name: str
    device_type: str
    devices: int
    intra_bandwidth: float  # bytes/s between two devices of this node
    inter_bandwidth: float  # bytes/s of this node's link to other nodes
    nics: int | None = None  # NICs sharing it among the rings that cross at once (H17); None: each ring has it whole
    intra_latency: float = 0.0  # seconds per message between two devices of this node (H19)
    inter_latency: float = 0.0  # seconds per message on this node's link to other nodes (H19)

    @property
    def compute_key(self) -> tuple[str, float, float]:
        """What a layer's time on a tp group inside this node depends on (eq. H2, H19): the device
        type and the node's link, bandwidth and latency (:attr:`NodeClass.compute_key` of its class)."""
        return self.device_type, self.intra_bandwidth, self.intra_latency


@dataclass(frozen=True)
class Profile:
    """Measured forward+backward seconds per layer for one micro-batch."""

    device_type: str
    tp: int
    micro_batch: int
    layer_times: tuple[float, ...]


@dataclass(frozen=True)
class Training:
    global_batch: int
    weight_bytes: float  # model state bytes per parameter, by part
    gradient_bytes: float
    optimizer_bytes: float
    allreduce_bytes_per_param: float
    activation_element_bytes: float
    zero_stage: int
    memory_reserve: float  # bytes per device
    analytic_efficiency: float
    activation_factor: float = 1.0  # measured / modelled activation bytes (calibration C6)
    gradient_buffer_bytes_per_param: float = 0.0  # reduction buffers of a stage with replicas (H9; calibration C7)
    communicator_bytes: tuple[float, float] = (0.0, 0.0)  # NCCL buffers per communicator of 2 ranks, of more (H14)
    fragmentation: float = 0.0  # allocator bytes lost to fragmentation, per allocated byte (H14)
    overlap_grad_reduce: bool = False  # the engine reduces gradients during the last backward pass (H18)
    tokens_per_sample: int | None = None  # the sequence length, when the model says (presets)


# search.idle, widest first: any device ("devices"), whole nodes, whole node classes, none
IDLE_SPACES = ("devices", "nodes", "classes", "none")


def idle_level(value: bool | str) -> str:
    """``search.idle`` as one of IDLE_SPACES: true is "devices" (any device may stay idle), false
    is "none" (a record built in code may still hold a bool)."""
    if isinstance(value, bool):
        return "devices" if value else "none"
    return value


@dataclass(frozen=True)
class SearchSpace:
    """The decisions the search may take (each within the engine's rules, :mod:`.engines`)."""

    tp: tuple[int, ...]
    micro_batches: tuple[int, ...]
    max_pp: int
    cp: tuple[int, ...] = (1,)
    sequence_parallel: tuple[bool, ...] = (False,)
    recompute: tuple[str, ...] = ("none",)
    recompute_layers: tuple[int, ...] = ()  # block counts searched with full recomputation (Megatron's block method)
    zero_stages: tuple[int, ...] = (0,)
    virtual_stages: tuple[int, ...] = (1,)
    idle: str = "none"  # which devices a plan may leave idle: one of IDLE_SPACES
    per_stage_recompute: bool = False  # whether stages choose their recomputation (where the engine allows it)
    engine: str = "megatron"
    tp_across_nodes: bool = False  # whether a tensor-parallel group may span nodes (hetero.md H16)


@dataclass(frozen=True)
class Instance:
    """A validated problem instance.  Devices are numbered node-major."""

    name: str
    layers: tuple[Layer, ...]
    device_types: Mapping[str, DeviceType]
    nodes: tuple[Node, ...]
    profiles: tuple[Profile, ...]
    training: Training
    search: SearchSpace
    notes: tuple[str, ...] = field(default=())

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @cached_property
    def num_devices(self) -> int:
        return sum(node.devices for node in self.nodes)

    @cached_property
    def device_node(self) -> np.ndarray:
        """Node index of every global device id."""
        return np.repeat(np.arange(len(self.nodes)), [n.devices for n in self.nodes])

    @cached_property
    def node_first_device(self) -> tuple[int, ...]:
        starts = np.concatenate([[0], np.cumsum([n.devices for n in self.nodes])[:-1]])
        return tuple(int(s) for s in starts)

    @cached_property
    def node_classes(self):
        """Interchangeable nodes grouped into classes (:mod:`amp_opt.model.classes`)."""
        return group_nodes(self.nodes)

    @cached_property
    def layer_flops(self) -> np.ndarray:
        """Per layer: forward+backward FLOPs per sample (nan where not given)."""
        return np.array([np.nan if layer.flops is None else layer.flops for layer in self.layers], dtype=float)

    @cached_property
    def layer_tp_comm(self) -> np.ndarray:
        """Per layer: bytes all-reduced in the tensor-parallel group per sample."""
        return np.array([layer.tp_comm_bytes for layer in self.layers], dtype=float)

    @cached_property
    def layer_tp_messages(self) -> np.ndarray:
        """Per layer: allreduces the tensor-parallel group runs per micro-batch (H19)."""
        return np.array([layer.tp_comm_messages for layer in self.layers], dtype=float)

    @cached_property
    def transformer_span(self) -> tuple[int, int]:
        """[first, last) of the transformer layers (every layer when there are none)."""
        body = [i for i, layer in enumerate(self.layers) if layer.kind == "transformer"]
        return (body[0], body[-1] + 1) if body else (0, self.num_layers)

    @cached_property
    def layer_facts(self) -> dict[str, int | bool]:
        """What the candidate rules ask of the layer list as a whole, computed once (with 10^5
        layers, asking it per candidate took minutes): ``kv`` some layer has keys and values,
        ``scores`` some layer keeps attention scores, ``recomputing`` how many layers may
        recompute, ``blocks`` the layers are coarsened blocks."""
        return {
            "kv": any(layer.kv_bytes.replicated + layer.kv_bytes.sharded > 0 for layer in self.layers),
            "scores": any(layer.attention_memory_bytes.replicated + layer.attention_memory_bytes.sharded > 0
                          for layer in self.layers),
            "recomputing": sum(bool(layer.recomputes) for layer in self.layers),
            "blocks": any(bool(layer.members) for layer in self.layers),
        }

    @cached_property
    def devices_by_type(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for node in self.nodes:
            counts[node.device_type] = counts.get(node.device_type, 0) + node.devices
        return counts

    def link_bandwidth(self, a: int, b: int) -> float:
        """Bytes/s between devices a and b: intra-node, else the slower NIC."""
        na, nb = self.nodes[self.device_node[a]], self.nodes[self.device_node[b]]
        if self.device_node[a] == self.device_node[b]:
            return na.intra_bandwidth
        return min(na.inter_bandwidth, nb.inter_bandwidth)
