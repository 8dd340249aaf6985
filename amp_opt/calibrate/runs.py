"""RUNS.json: measured runs of whole plans, read and checked once.

The format (other tools write it too, so it is kept exactly so) is a JSON list of
records::

    {"plan": <plan object>, "iteration_time": <seconds>}     a run that finished
    {"plan": <plan object>, "failed": "oom"}                  ran out of memory
    {"plan": <plan object>, "failed": "error"}                failed otherwise

A plan is as in ``plan.schema.json`` (``stages`` optional: rank order).  A record
may add ``"instance": <path>`` (relative to the RUNS.json file) when the run was
made on another cluster or batch than the instance being calibrated, and
``"peak_memory": <bytes>``, the largest peak over the run's devices as the
framework's allocator reports it, and ``"memory_limit": <bytes>``, the memory each
device of the run had (what ``run`` ran under: ``--memory-limit`` or the GPU's
memory), which an out-of-memory or finished run is compared with instead of the
instance's device memory.  Other fields are ignored.  Every problem is an
:class:`~amp_opt.errors.InputError` naming the record: ``RUNS.json[3].iteration_time``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import InputError
from ..model.load import load_json, parse_instance
from ..model.evaluate import evaluate
from ..model.plan import Pipelines, Plan, check_plan, devices_of, parse_plan
from ..model.tables import Tables

FAILURES = ("oom", "error")
COST_MODEL = "hetero"  # the model the fit scores (amp_opt.calibrate.predict)


@dataclass(frozen=True)
class RunRecord:
    """One measured run: a plan, and its iteration time or how it failed.

    ``instance`` is the resolved path of the record's own instance (None: the
    instance being calibrated); ``index`` its position in the file.
    """

    index: int
    plan: Plan | Pipelines
    iteration_time: float | None = None  # seconds, for finished runs
    failed: str | None = None  # "oom" or "error"
    peak_memory: float | None = None  # bytes, largest over the run's devices
    instance: str | None = None
    memory_limit: float | None = None  # bytes of memory each device of the run had (None: the instance's)

    @property
    def finished(self) -> bool:
        return self.failed is None

    def to_json(self) -> dict[str, Any]:
        """The record in the RUNS.json format (instance path as resolved)."""
        out: dict[str, Any] = {"plan": self.plan.to_json()}
        if self.failed is None:
            out["iteration_time"] = self.iteration_time
        else:
            out["failed"] = self.failed
        if self.peak_memory is not None:
            out["peak_memory"] = self.peak_memory
        if self.instance is not None:
            out["instance"] = self.instance
        if self.memory_limit is not None:
            out["memory_limit"] = self.memory_limit
        return out


def _positive(value: Any, where: str, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InputError(where, f"must be a positive finite number of {what}, got {value!r}")
    return float(value)


def parse_runs(data: Any, *, base_dir: str | Path = ".", where: str = "RUNS.json") -> tuple[RunRecord, ...]:
    """Check a parsed RUNS.json list; return its records.

    Parameters
    ----------
    data : list
        The parsed file (NaN and infinities allowed through, so that they are reported here).
    base_dir : path
        Folder ``"instance"`` paths are relative to (the RUNS.json file's).
    where : str
        Name used in error messages.

    Examples
    --------
    >>> plan = {"tp": 1, "dp": 1, "pp": 2, "micro_batch": 1, "partition": [0, 3, 6]}
    >>> runs = parse_runs([{"plan": plan, "iteration_time": 0.5}, {"plan": plan, "failed": "oom"}])
    >>> [(r.index, r.iteration_time, r.failed) for r in runs]
    [(0, 0.5, None), (1, None, 'oom')]
    >>> parse_runs([{"plan": plan, "iteration_time": float("nan")}])
    Traceback (most recent call last):
    ...
    amp_opt.errors.InputError: RUNS.json[0].iteration_time: must be a positive finite number of seconds, got nan
    """
    if not isinstance(data, list):
        raise InputError(where, f"must be a JSON list of run records, got {type(data).__name__}")
    records = []
    for i, raw in enumerate(data):
        at = f"{where}[{i}]"
        if not isinstance(raw, Mapping):
            raise InputError(at, f"must be an object with a plan, got {type(raw).__name__}")
        if "plan" not in raw:
            raise InputError(at, "has no plan")
        plan = parse_plan(raw["plan"], where=f"{at}.plan")
        failed, time = raw.get("failed"), raw.get("iteration_time")
        if failed is not None:
            if failed not in FAILURES:
                raise InputError(f"{at}.failed", f"must be \"oom\" or \"error\", got {failed!r}")
            if time is not None:
                raise InputError(at, "has both an iteration_time and failed: a run either finished or failed")
        elif time is None:
            raise InputError(at, "needs an iteration_time (a finished run) or failed: \"oom\" | \"error\"")
        else:
            time = _positive(time, f"{at}.iteration_time", "seconds")
        peak = raw.get("peak_memory")
        if peak is not None:
            peak = _positive(peak, f"{at}.peak_memory", "bytes")
        instance = raw.get("instance")
        if instance is not None:
            if not isinstance(instance, str) or not instance:
                raise InputError(f"{at}.instance", f"must be a path (relative to {where}), got {instance!r}")
            instance = str(Path(base_dir) / instance)
        limit = raw.get("memory_limit")
        if limit is not None:
            limit = _positive(limit, f"{at}.memory_limit", "bytes")
        records.append(RunRecord(i, plan, time, failed, peak, instance, limit))
    return tuple(records)


def load_runs(path: str | Path) -> tuple[RunRecord, ...]:
    """Read and check a RUNS.json file (:func:`parse_runs`); NaN or infinite times are
    reported with the record they are in.

    Examples
    --------
    >>> load_runs("missing.json")
    Traceback (most recent call last):
    ...
    amp_opt.errors.InputError: missing.json: runs file not found
    """
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputError(str(path), "runs file not found") from None
    except OSError as exc:
        raise InputError(str(path), f"cannot read runs file ({exc.strerror})") from None
    try:
        data = json.loads(text)  # NaN / Infinity pass, and are reported by parse_runs with their record
    except json.JSONDecodeError as exc:
        raise InputError(str(path), f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    return parse_runs(data, base_dir=path.parent, where=path.name)


def load_uncalibrated(source: str | Path | Mapping) -> tuple[dict, Any]:
    """(document, uncalibrated Instance) of an instance file or document: the model a fit starts from.

    Examples
    --------
    >>> doc, inst = load_uncalibrated("instances/amp_het_cluster.json")
    >>> inst.device_types["T4"].compute_scale
    1.0
    """
    if isinstance(source, Mapping):
        document, base_dir, name = dict(source), Path.cwd(), "instance"
    else:
        path = Path(source)
        document, base_dir, name = load_json(path, "instance"), path.parent, path.stem
    return document, parse_instance(document, base_dir=base_dir, default_name=name, calibrate=False)


@dataclass(frozen=True)
class RunSet:
    """Runs bound to their (uncalibrated) instances: ``instances[key]`` for each record's ``key``.

    ``key`` is None for the instance being calibrated, else the record's instance path.
    """

    records: tuple[RunRecord, ...]
    instances: Mapping[str | None, Any]
    where: str = "RUNS.json"

    def instance_of(self, record: RunRecord):
        return self.instances[record.instance]

    @property
    def finished(self) -> tuple[RunRecord, ...]:
        return tuple(r for r in self.records if r.finished)

    def device_types(self, record: RunRecord) -> tuple[str, ...]:
        """The device types the record's plan runs on (sorted)."""
        inst = self.instance_of(record)
        return tuple(sorted({inst.nodes[inst.device_node[d]].device_type for d in devices_of(record.plan)}))


def bind_runs(records: Sequence[RunRecord], instance, *, where: str = "RUNS.json",
              instance_path: str | Path | None = None) -> RunSet:
    """Load every record's instance (uncalibrated), check each plan against its instance and that
    the cost model can price it (a profile, or FLOPs, for its tensor-parallel degree).

    ``instance`` is the uncalibrated instance records without ``"instance"`` ran on (read
    from ``instance_path``, if given: records naming that same file are bound to it).
    Returned records hold checked plans (explicit ``stages``).

    Examples
    --------
    >>> doc, inst = load_uncalibrated("instances/amp_het_cluster.json")
    >>> plan = {"tp": 1, "dp": 4, "pp": 4, "micro_batch": 1, "partition": [0, 7, 14, 20, 30]}
    >>> runs = bind_runs(parse_runs([{"plan": plan, "iteration_time": 1.2}]), inst)
    >>> runs.device_types(runs.records[0]), runs.records[0].plan.stages[3]
    (('T4', 'V100-16GB'), ((12,), (13,), (14,), (15,)))
    >>> bind_runs(parse_runs([{"plan": dict(plan, dp=8), "iteration_time": 1.2}]), inst)
    Traceback (most recent call last):
    ...
    amp_opt.errors.InputError: RUNS.json[0].plan: tp*cp*dp*pp = 1*1*8*4 = 32, the cluster has 16 devices
    """
    instances: dict[str | None, Any] = {None: instance}
    tables: dict[str | None, Tables] = {}
    own = Path(instance_path).resolve() if instance_path is not None else None
    checked = []
    for r in records:
        at = f"{where}[{r.index}]"
        if r.instance is not None and own is not None and Path(r.instance).resolve() == own:
            r = replace(r, instance=None)
        if r.instance is not None and r.instance not in instances:
            try:
                instances[r.instance] = load_uncalibrated(r.instance)[1]
            except InputError as exc:
                raise InputError(f"{at}.instance", str(exc)) from None
        plan = check_plan(instances[r.instance], r.plan, where=f"{at}.plan")
        try:  # the model must price it (a profile or FLOPs for its tp degree): said with the record's name
            if r.instance not in tables:
                tables[r.instance] = Tables(instances[r.instance])
            evaluate(instances[r.instance], plan, COST_MODEL, tables=tables[r.instance])
        except InputError as exc:
            raise InputError(at, str(exc)) from None
        checked.append(replace(r, plan=plan))
    return RunSet(tuple(checked), instances, where)
