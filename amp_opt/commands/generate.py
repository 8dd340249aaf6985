"""``generate``: write a random heterogeneous instance (deterministic for a seed).

Its model is sized against the cluster's memory at random, so some instances hold no plan at
all; after writing, ``generate`` solves the instance for at most ``--check`` seconds and says on
stderr when no plan fits (or when the check ran out of time), so that nobody mistakes such a
file for a broken solver.  The exit code stays 0: the file is valid either way.
"""

from __future__ import annotations

import json
import sys

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
    p.add_argument("--check", type=float, default=10.0, metavar="S",
                   help="seconds to spend solving the instance after writing it, to say on stderr when no plan "
                        "fits (0: no check; default: 10)")


def run(args) -> int:
    doc = generate_instance(args.seed, nodes=args.nodes, devices_per_node=args.devices_per_node,
                            device_types=args.device_types, layers=args.layers, global_batch=args.global_batch)
    instance = parse_instance(doc)  # generated instances must always validate
    write_text(json.dumps(doc, indent=1) + "\n", args.output)
    if args.check > 0:
        _check(instance, args.check)
    return 0


def _check(instance, seconds: float) -> None:
    """Say on stderr when no plan fits the instance, or when that was not settled in ``seconds``."""
    from ..errors import InfeasibleError, NoPlanFound
    from ..search.solve import solve

    try:
        solve(instance, time_limit=seconds)
    except InfeasibleError as exc:
        print(f"note: no plan fits this instance: {exc}", file=sys.stderr)
    except NoPlanFound:
        print(f"note: whether a plan fits this instance was not settled in --check {seconds:g} s", file=sys.stderr)
