"""The runtime's view of an instance's model: its :class:`ModelShape`, layer names and torch dtype.

Kept apart from :mod:`amp_opt.runtime.modules` (which builds the modules) so the checks a run or a
profile makes before any process starts read the model without building it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from ..errors import InputError
from ..model.hf_config import preset_from_hf_config
from ..model.load import load_json
from ..model.presets import ModelShape, build_layers, parse_model

from ._torch import require_torch

torch = require_torch()

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def model_shape(model: ModelShape | Mapping, *, base_dir: str | Path = ".") -> ModelShape:
    """The :class:`ModelShape` of a model spec, of an instance document, or itself.

    Parameters
    ----------
    model : ModelShape, or dict
        A ``{"preset": ...}`` or ``{"hf_config": ...}`` model spec, or a whole
        instance document (its ``model`` field is used).
    base_dir : path
        Where a relative ``hf_config`` path is looked up.

    Raises
    ------
    InputError
        For a model given as an explicit ``layers`` list: it has no dimensions.

    Examples
    --------
    >>> model_shape({"preset": "gpt", "hidden": 64, "layers": 2, "heads": 4, "seq_len": 16, "vocab": 100}).ffn
    256
    """
    if isinstance(model, ModelShape):
        return model
    field = "model"
    if isinstance(model, Mapping) and "model" in model and "preset" not in model:
        model, field = model["model"], "instance.model"
    if not isinstance(model, Mapping):
        raise InputError(field, f"must be an object, got {type(model).__name__}")
    if "preset" in model:
        return parse_model(dict(model), field)
    if "hf_config" in model:
        config = model["hf_config"]
        if isinstance(config, str):
            config = load_json(Path(base_dir) / config, "Hugging Face config")
        preset = preset_from_hf_config(config, field=f"{field}.hf_config", seq_len=model.get("seq_len"))
        return parse_model(preset, f"{field}.hf_config")
    raise InputError(f"{field}.layers", "an explicit layer list has no dimensions, so no modules can be built from it: "
                     "the runtime needs model.preset or model.hf_config")


def layer_names(shape: ModelShape) -> list[str]:
    """The amp_opt layer names of a model, in order."""
    return [layer["name"] for layer in build_layers(shape)]


def torch_dtype(dtype, shape: ModelShape | None = None):
    """A torch dtype from a name, a dtype, or ``None`` (the model's ``dtype_bytes``: 4 fp32, 2 bf16)."""
    if dtype is None:
        if shape is None or shape.dtype_bytes == 4:
            return torch.float32
        if shape.dtype_bytes == 2:
            return torch.bfloat16
        raise InputError("model.dtype_bytes", f"no torch dtype of {shape.dtype_bytes} bytes (use 2 or 4)")
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise InputError("dtype", f"must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]
