"""``generate``: write a random heterogeneous instance (deterministic for a seed)."""

from __future__ import annotations

import json

from ..model.generate import generate_instance
from ..model.load import parse_instance
from .common import positive_int, write_text


def add_arguments(p) -> None:
    """The options of the command."""
    p.add_argument("--seed", type=int, required=True, metavar="S",
                   help="random seed (required): the same seed and options give the same instance")
    p.add_argument("--nodes", type=positive_int, default=4, metavar="N", help="number of nodes (default: 4)")
    p.add_argument("--devices-per-node", type=positive_int, default=4, metavar="K",
                   help="GPUs per node, the same on every node (default: 4)")
    p.add_argument("--device-types", type=positive_int, default=2, metavar="T",
                   help="how many GPU types (a count, at most --nodes; the types are drawn from the catalog: "
                        "T4, V100-16GB, V100-32GB, A10G, L4, RTX-4090, A100-40GB, A100-80GB, H100-80GB, H200) "
                        "(default: 2)")
    p.add_argument("--layers", type=positive_int, default=8, metavar="L",
                   help="entries of the layer list, embedding and head included (at least 3; default: 8)")
    p.add_argument("--global-batch", type=positive_int, default=16, metavar="B",
                   help="samples per training iteration (default: 16)")
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="instance file to write (required; '-' for stdout)")


def run(args) -> int:
    doc = generate_instance(args.seed, nodes=args.nodes, devices_per_node=args.devices_per_node,
                            device_types=args.device_types, layers=args.layers, global_batch=args.global_batch)
    parse_instance(doc)  # generated instances must always validate
    write_text(json.dumps(doc, indent=1) + "\n", args.output)
    return 0
