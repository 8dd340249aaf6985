"""Benchmark instances: the bundled suites, or any files, folders and globs; their order and sizes."""

from __future__ import annotations

import glob
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import InputError
from ..model.load import load_instance

# The bundled suites are package data (amp_opt/bench/data/<suite>/*.json), so that ``bench --suite``
# runs outside the checkout; instances/ holds the same files for users of the checkout
# (tests/test_bench_suites.py checks that the two copies are equal).
SUITE_CHOICES = ("paper", "scale", "all")
# The paper suite's order: the paper's experiments as it lists them.
PAPER_ORDER = ("amp_homogeneous.json", "amp_het_cluster.json", "amp_het_model.json")


@dataclass(frozen=True)
class BenchInstance:
    """An instance of a suite: where it is and its size."""

    suite: str
    path: Path
    name: str
    devices: int
    nodes: int
    gpu_types: int
    layers: int
    global_batch: int


def suite_folder(name: str) -> Path:
    """The folder of a bundled suite's instance files, inside the installed package."""
    folder = resources.files("amp_opt.bench") / "data" / name
    if not isinstance(folder, Path):  # a zipped install: the files are not on disk
        raise InputError("--suite", f"suite {name!r}: the package's data is not on the file system ({folder})")
    return folder


def suite_paths(suite: str) -> list[tuple[str, Path]]:
    """(suite name, instance file) pairs of "paper", "scale" or "all", in a fixed order.

    >>> [p.name for _, p in suite_paths("paper")]
    ['amp_homogeneous.json', 'amp_het_cluster.json', 'amp_het_model.json']
    """
    if suite not in SUITE_CHOICES:
        raise InputError("--suite", f"unknown suite {suite!r} (choose from {', '.join(SUITE_CHOICES)})")
    names = ("paper", "scale") if suite == "all" else (suite,)
    out = []
    for name in names:
        folder = suite_folder(name)
        files = sorted(folder.glob("*.json"))
        if name == "paper":
            files = [folder / f for f in PAPER_ORDER]
        if not files or not all(f.is_file() for f in files):
            raise InputError("--suite", f"suite {name!r}: no instance files at {folder}")
        out.extend((name, f) for f in files)
    return out


def order_entries(entries: list[BenchInstance]) -> list[BenchInstance]:
    """Suites in their given order; within a suite, by GPU count (small runs first), then file order."""
    rank = {name: i for i, name in enumerate(dict.fromkeys(e.suite for e in entries))}
    return sorted(entries, key=lambda e: (rank[e.suite], e.devices))


def describe(suite: str, path: Path) -> BenchInstance:
    """Load an instance file (InputError naming the file if it is not an instance) and record its size."""
    try:
        inst = load_instance(path)
    except InputError as exc:
        where = exc.field if exc.field.startswith(str(path)) else f"{path}: {exc.field}" if exc.field else str(path)
        raise InputError(where, f"not a valid instance: {exc.problem}") from None
    return BenchInstance(suite, Path(path), inst.name, inst.num_devices, len(inst.nodes), len(inst.devices_by_type),
                         inst.num_layers, inst.training.global_batch)


def expand_paths(paths) -> list[tuple[str, Path]]:
    """(group, instance file) pairs for files, folders (their ``*.json``) and globs, in the given order.

    The group (the ``suite`` column) is the file's folder name.  A missing file, a folder without
    instance files or a glob without matches is an InputError naming it.
    """
    out: list[tuple[str, Path]] = []
    for text in paths:
        path = Path(text)
        if path.is_dir():
            files = sorted(f for f in path.glob("*.json") if f.is_file())
            if not files:
                raise InputError(str(path), "folder holds no instance files (*.json)")
        elif path.is_file():
            files = [path]
        elif glob.has_magic(text):
            files = sorted(Path(f) for f in glob.glob(text) if Path(f).is_file())
            if not files:
                raise InputError(text, "no instance file matches this pattern")
        else:
            raise InputError(text, "no such instance file or folder")
        out.extend((f.resolve().parent.name, f) for f in files)
    seen, unique = set(), []
    for group, f in out:  # the same file given twice runs once
        if f.resolve() not in seen:
            seen.add(f.resolve())
            unique.append((group, f))
    return unique
