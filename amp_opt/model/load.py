"""Loading instances: JSON in, a validated :class:`~amp_opt.model.instance.Instance` out.

All validation happens here, at the boundary: the JSON Schema checks the
shape (``schema/instance.schema.json``), then the cross-references and the
semantics are checked field by field.  Units are converted to SI once.

The module is a little over 400 lines because it is the instance format's one boundary: each
section's checks sit together, so that a field is validated in exactly one place.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

import jsonschema

from ..errors import InputError
from . import catalog
from .calibration import apply_calibration
from .coarsen import MAX_MODEL_LAYERS
from .hf_config import preset_from_hf_config
from .instance import IDLE_SPACES, DeviceType, idle_level, Instance, Layer, Node, Profile, SearchSpace, Split, Training
from .presets import expand_preset
from .units import parse_bandwidth, parse_bytes

FORMAT_VERSION = 1
SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schema" / "instance.schema.json"

MAX_DEVICES = 65_536  # GPUs in one instance (benchmarks/results/time_limits.md: sizes up to it run in time)
DEFAULT_TP = (1, 2, 4, 8)
DEFAULT_CP = (1, 2, 4, 8, 16)  # context-parallel degrees the search may try
DEFAULT_VIRTUAL = (1, 2, 4)  # virtual pipeline stages per device (interleaved 1F1B)
RECOMPUTE = ("none", "selective", "full")
DEFAULT_MEMORY_RESERVE = 2**30  # 1 GiB: CUDA context, kernels and library workspaces (H14)
# H14: NCCL buffers per communicator a rank uses, of two ranks and of more.  Default none: the
# 1 GiB reserve stands for all the framework memory unless an instance states the parts.  Measured
# values to state: 544 MB and 688 MB, the GPU memory one communicator took after a 4 MB allreduce
# on 4 x A100 with NVLink (NVIDIA/nccl issue 964); NCCL's buffers grow with its channels.
DEFAULT_COMMUNICATOR_BYTES = (0.0, 0.0)
NVLINK_A100_COMMUNICATOR_BYTES = (544e6, 688e6)
DEFAULT_EFFICIENCY = 0.4  # fraction of peak FLOP/s the datasheet estimate assumes (device types with no profile)
MIXED_PRECISION_ADAM = {"weights": 2.0, "gradients": 2.0, "optimizer": 12.0}


def load_json(path: str | Path, what: str) -> Any:
    """Parse a JSON file; any failure is an InputError naming the file."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputError(str(path), f"{what} file not found") from None
    except OSError as exc:
        raise InputError(str(path), f"cannot read {what} file ({exc.strerror})") from None
    def reject(constant):
        raise InputError(str(path), f"not valid JSON: {constant} is not a number JSON allows")

    try:
        return json.loads(text, parse_constant=reject)
    except json.JSONDecodeError as exc:
        raise InputError(str(path), f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None


def json_path(parts) -> str:
    """Render a JSON location as ``nodes[2].devices``."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


LONG_LIST = 1000  # layers from which the layer list is checked by _layer_ok first (jsonschema: ~0.2 ms a layer)


def _number(x, integer: bool = False) -> bool:
    """A JSON number (integer) >= 0 as the schema means it; bool is not a number."""
    if isinstance(x, bool) or not isinstance(x, (int, float) if not integer else int):
        return False
    return x >= 0


def _split_ok(x, integer: bool = False) -> bool:
    if isinstance(x, dict):
        return set(x) <= {"replicated", "sharded"} and all(_number(v) for v in x.values())
    return _number(x, integer)


LAYER_KEYS = {"name", "kind", "params", "activation_bytes", "activation_memory_bytes", "flops", "tp_comm_bytes",
              "tp_comm_messages",
              "tie", "tied_params", "attention_memory_bytes", "attention_flops", "kv_bytes"}  # the schema's $defs/layer


def _layer_ok(x) -> bool:
    """A layer that the schema's ``$defs/layer`` surely accepts (never accepts what it rejects; a
    False sends the document to the full validator, which says what is wrong)."""
    return (isinstance(x, dict) and set(x) <= LAYER_KEYS and isinstance(x.get("name"), str)
            and "params" in x and "activation_bytes" in x and isinstance(x.get("kind", ""), str)
            and _split_ok(x["params"], integer=True) and _split_ok(x["activation_bytes"])
            and _split_ok(x.get("activation_memory_bytes", 0)) and _number(x.get("flops", 0))
            and _number(x.get("tp_comm_bytes", 0)) and _number(x.get("tp_comm_messages", 0), integer=True)
            and isinstance(x.get("tie", ""), str)
            and _number(x.get("tied_params", 0), integer=True) and _split_ok(x.get("attention_memory_bytes", 0))
            and _number(x.get("attention_flops", 0)) and _split_ok(x.get("kv_bytes", 0)))


def _default_messages(raw: dict) -> int:
    """A layer's tp allreduces per micro-batch where it does not say (H19): a transformer layer's
    four (Megatron's two in forward, two in backward), one for any other layer that all-reduces
    bytes (bytes sent take at least one message), none for a layer that sends none."""
    if not raw.get("tp_comm_bytes"):
        return 0
    return 4 if raw.get("kind") == "transformer" else 1


def _shortened(data: Any) -> Any:
    """The document with a long layer list (and the profiles' times) cut to one entry, when every
    layer passes the fast check: the schema then only needs to look at the rest.  Otherwise
    the document itself."""
    model = data.get("model") if isinstance(data, Mapping) else None
    layers = model.get("layers") if isinstance(model, Mapping) else None
    if not isinstance(layers, list) or len(layers) < LONG_LIST or not all(_layer_ok(x) for x in layers):
        return data
    profiles = data.get("profiles")
    if isinstance(profiles, list):
        for prof in profiles:
            times = prof.get("layer_times") if isinstance(prof, Mapping) else None
            if isinstance(times, list) and not all(_number(t) for t in times):
                return data
        profiles = [dict(prof, layer_times=prof["layer_times"][:1])
                    if isinstance(prof, Mapping) and isinstance(prof.get("layer_times"), list) else prof
                    for prof in profiles]
    short = dict(data, model=dict(model, layers=layers[:1]))
    if profiles is not None:
        short["profiles"] = profiles
    return short


def check_schema(data: Any, schema_path: Path, root: str) -> None:
    """Validate against a JSON Schema; raise the most relevant error as InputError."""
    data = _shortened(data) if schema_path == SCHEMA_PATH else data
    schema = json.loads(schema_path.read_text())
    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(data))
    if error is not None:
        where = json_path(error.absolute_path)
        raise InputError(f"{root}.{where}" if where else root, error.message)


def load_instance(source: str | Path | Mapping) -> Instance:
    """Load and validate an instance from a JSON file path or an already parsed dict.

    Parameters
    ----------
    source : str, Path or mapping
        An instance file (JSON, ``instance.schema.json``) or its parsed content.

    Returns
    -------
    Instance

    Raises
    ------
    InputError
        Naming the offending field.

    Examples
    --------
    >>> inst = load_instance("instances/amp_het_cluster.json")
    >>> inst.num_devices, inst.num_layers, sorted(inst.devices_by_type.items())
    (16, 30, [('T4', 4), ('V100-16GB', 12)])
    """
    if isinstance(source, Mapping):
        return parse_instance(source, base_dir=Path.cwd())
    path = Path(source)
    data = load_json(path, "instance")
    return parse_instance(data, base_dir=path.parent, default_name=path.stem)


def parse_instance(data: Any, *, base_dir: Path | None = None, default_name: str = "instance",
                   calibrate: bool = True) -> Instance:
    """Validate a parsed instance document and build the typed record.

    With ``calibrate=False`` the document's ``calibration`` section is validated but
    not applied (the uncalibrated model, which ``calibrate`` fits from).
    """
    if not isinstance(data, Mapping):
        raise InputError("instance", "must be a JSON object")
    if "version" in data and data["version"] != FORMAT_VERSION:
        raise InputError("instance.version", f"this amp_opt reads format version {FORMAT_VERSION}, got {data['version']!r}")
    check_schema(data, SCHEMA_PATH, "instance")

    notes: list[str] = []
    layers, tokens = _parse_model(data["model"], base_dir or Path.cwd(), notes)
    device_types = _parse_device_types(data.get("device_types", []))
    nodes = _parse_nodes(data["nodes"], device_types)
    profiles = _parse_profiles(data.get("profiles", []), device_types, layers)
    training = replace(_parse_training(data["training"]), tokens_per_sample=tokens)
    search = _parse_search(data.get("search", {}), training, len(layers))
    instance = Instance(
        name=data.get("name", default_name),
        layers=layers,
        device_types=device_types,
        nodes=nodes,
        profiles=profiles,
        training=training,
        search=search,
        notes=tuple(notes),
    )
    return apply_calibration(instance, data.get("calibration")) if calibrate else instance


def _split(value, default_sharded: bool) -> Split:
    if isinstance(value, Mapping):
        return Split(float(value.get("replicated", 0.0)), float(value.get("sharded", 0.0)))
    return Split(0.0, float(value)) if default_sharded else Split(float(value), 0.0)


def _parse_model(model: Mapping, base_dir: Path, notes: list[str]) -> tuple[tuple[Layer, ...], int | None]:
    """The layers, and the tokens of one sample when the model says (presets, Hugging Face configs)."""
    tokens = None
    if "preset" in model:
        _check_length(model, "instance.model.layers")
        raw_layers = expand_preset(dict(model), field="instance.model")
        tokens = int(model["seq_len"])
    elif "hf_config" in model:
        config = model["hf_config"]
        if isinstance(config, str):
            config = load_json(base_dir / config, "Hugging Face config")
        preset = preset_from_hf_config(config, field="instance.model.hf_config", seq_len=model.get("seq_len"))
        if "attention" in model:  # the kernel is the run's choice, not the config's
            preset["attention"] = model["attention"]
        _check_length(preset, "instance.model.hf_config")
        raw_layers = expand_preset(preset, field="instance.model.hf_config")
        tokens = int(preset["seq_len"])
        notes.append(f"model expanded from a Hugging Face config into the {preset['preset']} preset")
        if model.get("seq_len") is None:  # a config states the longest context, not the one trained with
            notes.append(f"sequence length {tokens} taken from the config's longest position; set "
                         "model.seq_len to the length the run trains with")
    else:
        raw_layers = model["layers"]
    if len(raw_layers) > MAX_MODEL_LAYERS:
        raise InputError("instance.model.layers", f"{len(raw_layers)} layers; amp_opt loads at most {MAX_MODEL_LAYERS}")

    layers = []
    for i, raw in enumerate(raw_layers):
        layers.append(
            Layer(
                name=raw["name"],
                kind=raw.get("kind", "layer"),
                params=_split(raw["params"], default_sharded=True),
                activation_bytes=_split(raw["activation_bytes"], default_sharded=False),
                activation_memory_bytes=_split(raw.get("activation_memory_bytes", 0.0), default_sharded=False),
                flops=float(raw["flops"]) if raw.get("flops") is not None else None,
                tp_comm_bytes=float(raw.get("tp_comm_bytes", 0.0)),
                tie=raw.get("tie"),
                tied_params=float(raw["tied_params"]) if raw.get("tied_params") is not None else None,
                attention_memory_bytes=_split(raw.get("attention_memory_bytes", 0.0), default_sharded=False),
                attention_flops=float(raw.get("attention_flops", 0.0)),
                kv_bytes=_split(raw.get("kv_bytes", 0.0), default_sharded=True),
                tp_comm_messages=int(raw.get("tp_comm_messages", _default_messages(raw))),
            )
        )
        scores, kept = layers[-1].attention_memory_bytes, layers[-1].activation_memory_bytes
        for part in ("replicated", "sharded"):
            if getattr(scores, part) > getattr(kept, part):
                raise InputError(f"instance.model.layers[{i}].attention_memory_bytes",
                                 f"{part} {getattr(scores, part):.6g} B is more than the layer's activation_memory_bytes "
                                 f"({getattr(kept, part):.6g} B): the attention scores are part of what the layer keeps")
    return tuple(layers), tokens


def _check_length(preset: Mapping, field: str) -> None:
    """A preset's transformer layers, checked before they are listed (embedding and head add 2)."""
    layers = preset.get("layers")
    if isinstance(layers, int) and not isinstance(layers, bool) and layers + 2 > MAX_MODEL_LAYERS:
        raise InputError(field, f"{layers} transformer layers; amp_opt loads at most {MAX_MODEL_LAYERS - 2}")


def _catalog_find(name: str):
    """The catalog entry for a name, or None."""
    try:
        return catalog.lookup(name, "")
    except InputError:
        return None


def _parse_device_types(raw_types) -> dict[str, DeviceType]:
    types: dict[str, DeviceType] = {}
    for i, raw in enumerate(raw_types):
        where = f"instance.device_types[{i}]"
        name = raw["name"]
        if name in types:
            raise InputError(f"{where}.name", f"device type {name!r} is defined twice")
        base = None
        if "catalog" in raw:
            base = catalog.lookup(raw["catalog"], f"{where}.catalog")
        else:
            base = _catalog_find(name)
        memory = parse_bytes(raw["memory"], f"{where}.memory") if "memory" in raw else (base.memory_bytes if base else None)
        if memory is None:
            raise InputError(f"{where}.memory", f"device type {name!r} is not in the GPU catalog, so its memory must be given")
        peak = float(raw["peak_flops"]) if "peak_flops" in raw else (base.peak_flops if base else None)
        price = float(raw["price_per_hour"]) if "price_per_hour" in raw else (base.price_per_hour if base else None)
        bandwidth = (parse_bandwidth(raw["memory_bandwidth"], f"{where}.memory_bandwidth") if "memory_bandwidth" in raw
                     else (base.memory_bandwidth if base else None))
        types[name] = DeviceType(name=name, memory=memory, peak_flops=peak, price_per_hour=price,
                                 memory_bandwidth=bandwidth)
    return types


def _parse_nodes(raw_nodes, device_types: dict[str, DeviceType]) -> tuple[Node, ...]:
    nodes: list[Node] = []
    names: set[str] = set()
    total = 0
    for i, raw in enumerate(raw_nodes):
        where = f"instance.nodes[{i}]"
        total += raw.get("count", 1) * raw["devices"]
        if total > MAX_DEVICES:  # checked before the nodes are listed one by one
            raise InputError(f"{where}.count" if raw.get("count", 1) > 1 else f"{where}.devices",
                             f"the cluster reaches {total} GPUs here; amp_opt plans at most {MAX_DEVICES} GPUs "
                             "(a plan lists every GPU by id)")
        type_name = raw["device_type"]
        if type_name not in device_types:
            spec = _catalog_find(type_name)
            if spec is None:
                known = ", ".join(sorted(device_types)) or "none"
                raise InputError(
                    f"{where}.device_type",
                    f"unknown device type {type_name!r}: not in device_types ({known}) nor in the GPU catalog",
                )
            device_types[type_name] = DeviceType(type_name, spec.memory_bytes, spec.peak_flops, spec.price_per_hour,
                                                 memory_bandwidth=spec.memory_bandwidth)
        intra = parse_bandwidth(raw["intra_bandwidth"], f"{where}.intra_bandwidth")
        inter = parse_bandwidth(raw["inter_bandwidth"], f"{where}.inter_bandwidth")
        latency = tuple(_latency(raw, key, where) for key in ("intra_latency", "inter_latency"))
        count = raw.get("count", 1)
        base_name = raw.get("name", f"node{i}")
        for j in range(count):
            name = base_name if count == 1 else f"{base_name}-{j}"
            if name in names:
                raise InputError(f"{where}.name", f"node name {name!r} is used twice")
            names.add(name)
            nodes.append(Node(name, type_name, raw["devices"], intra, inter, raw.get("nics"), *latency))
    return tuple(nodes)


def _latency(raw: dict, key: str, where: str) -> float:
    """A link's seconds per message (eq. H19): a finite number >= 0, 0 when not stated."""
    value = raw.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InputError(f"{where}.{key}", f"must be a number of seconds >= 0, not {value!r}")
    return float(value)


def _parse_profiles(raw_profiles, device_types, layers) -> tuple[Profile, ...]:
    num_layers = len(layers)
    seen = set()
    profiles = []
    for i, raw in enumerate(raw_profiles):
        where = f"instance.profiles[{i}]"
        if raw["device_type"] not in device_types:
            raise InputError(f"{where}.device_type", f"unknown device type {raw['device_type']!r}")
        times = tuple(float(t) for t in raw["layer_times"])
        if not all(math.isfinite(t) for t in times):
            raise InputError(f"{where}.layer_times", "every time must be a finite number of seconds")
        if len(times) != num_layers:
            raise InputError(f"{where}.layer_times", f"has {len(times)} entries, the model has {num_layers} layers")
        names = raw.get("layer_names")
        if names is not None and list(names) != [layer.name for layer in layers]:
            first = next((i for i, (a, b) in enumerate(zip(names, layers)) if a != b.name), min(len(names), num_layers))
            raise InputError(f"{where}.layer_names", f"were measured on another model: entry {first} is "
                             f"{names[first] if first < len(names) else 'missing'!r}, the model's layer is "
                             f"{layers[first].name if first < num_layers else 'missing'!r}")
        key = (raw["device_type"], raw["tp"], raw.get("micro_batch", 1))
        if key in seen:
            raise InputError(where, f"a second profile for device type {key[0]!r}, tp {key[1]}, micro_batch {key[2]}")
        seen.add(key)
        profiles.append(Profile(key[0], key[1], key[2], times))
    return tuple(profiles)


def _parse_training(raw: Mapping) -> Training:
    state = dict(MIXED_PRECISION_ADAM)
    state.update(raw.get("model_state_bytes_per_param", {}))
    reserve = raw.get("memory_reserve")
    comm = raw.get("communicator_bytes", {})
    communicators = tuple(_bytes_or_zero(comm[k], f"instance.training.communicator_bytes.{k}") if k in comm else default
                          for k, default in zip(("pair", "group"), DEFAULT_COMMUNICATOR_BYTES))
    return Training(
        global_batch=raw["global_batch"],
        weight_bytes=float(state["weights"]),
        gradient_bytes=float(state["gradients"]),
        optimizer_bytes=float(state["optimizer"]),
        allreduce_bytes_per_param=float(raw.get("gradient_allreduce_bytes_per_param", state["gradients"]) or 0.0),
        activation_element_bytes=float(raw.get("activation_element_bytes", 2.0)),
        zero_stage=int(raw.get("zero_stage", 0)),
        memory_reserve=DEFAULT_MEMORY_RESERVE if reserve is None else _bytes_or_zero(reserve, "instance.training.memory_reserve"),
        analytic_efficiency=float(raw.get("analytic_efficiency", DEFAULT_EFFICIENCY)),
        communicator_bytes=communicators,
        fragmentation=float(raw.get("fragmentation", 0.0)),
        overlap_grad_reduce=bool(raw.get("overlap_grad_reduce", False)),
        gradient_buffer_bytes_per_param=float(raw.get("gradient_buffer_bytes_per_param", 0.0)),
    )


def _bytes_or_zero(value, field: str) -> float:
    """Bytes from a number or a string (:func:`parse_bytes`), where 0 means none."""
    return 0.0 if value == 0 else parse_bytes(value, field)


def _parse_search(raw: Mapping, training: Training, num_layers: int) -> SearchSpace:
    """The decisions open to the search; each list restricts one, and absent means every value
    the engine's rules allow (``formulations/hetero.md``, "Decisions")."""
    tp = tuple(sorted(set(raw.get("tp", DEFAULT_TP))))
    if "micro_batches" in raw:
        micro = tuple(sorted(set(raw["micro_batches"])))
    else:
        micro = tuple(2**k for k in range(int(math.log2(training.global_batch)) + 1))
    max_pp = raw.get("max_pp", num_layers)
    return SearchSpace(
        tp=tp, micro_batches=micro, max_pp=min(max_pp, num_layers),
        cp=tuple(sorted(set(raw.get("cp", DEFAULT_CP)))),
        sequence_parallel=tuple(sorted(set(raw.get("sequence_parallel", (False, True))))),
        recompute=tuple(r for r in RECOMPUTE if r in raw.get("recompute", RECOMPUTE)),
        recompute_layers=tuple(sorted(set(raw.get("recompute_layers", ())))),
        zero_stages=tuple(sorted(set(raw.get("zero_stages", (0, 1, 2, 3))))),
        virtual_stages=tuple(sorted(set(raw.get("virtual_stages", DEFAULT_VIRTUAL)))),
        idle=_idle(raw.get("idle", True)),
        per_stage_recompute=bool(raw.get("per_stage_recompute", True)),
        engine=raw.get("engine", "megatron"),
        tp_across_nodes=bool(raw.get("tp_across_nodes", False)),
    )


def _idle(value) -> str:
    """``search.idle`` checked and as one of IDLE_SPACES (:func:`.instance.idle_level`)."""
    if not isinstance(value, bool) and value not in IDLE_SPACES:
        raise InputError("search.idle", f"must be true, false or one of {', '.join(IDLE_SPACES)}, got {value!r}")
    return idle_level(value)
