"""The pieces of the QK split that hold the norms still: each norm frozen at its actual statistics, and the small
readers of a trace and of a model's settings that ``model_core.qk.gather`` uses."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import numpy as np
import torch

from model_core.families.parts import norm_eps
from model_core.families.weights import LayerWeights
from model_core.kernel import float64_device, rounding_tolerance

# A trace's arrays are read-only and only read here; a per-call ``catch_warnings`` would not be thread-safe.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning,
                        module=__name__)
CPU = torch.device("cpu")


def tensor(array: Any) -> torch.Tensor:
    """A trace's read-only array as a tensor without a copy (nothing here writes to it; torch's "not writable"
    warning is filtered for this module's calls at import: a per-call ``catch_warnings`` is not thread-safe)."""
    return torch.from_numpy(np.asarray(array))


def on_cpu(lw: LayerWeights) -> LayerWeights:
    """A layer's weights on the CPU (the same object where they are there already)."""
    return on(lw, CPU)


def on(lw: LayerWeights, device: torch.device) -> LayerWeights:
    """A layer's weights on ``device`` (the same object where they are there already)."""
    moved = {f.name: v.to(device) for f in dataclasses.fields(lw)
             if isinstance(v := getattr(lw, f.name), torch.Tensor) and v.device != torch.device(device)}
    return dataclasses.replace(lw, **moved) if moved else lw


def split_device(model: Any) -> torch.device:
    """Where the QK split computes: the model's device, in float64 there; the CPU for a device without float64
    (Apple's MPS), whose weights are then copied over once a pass."""
    return float64_device(next(model.parameters()).device)


SUM_TOLERANCE = 1e-3
"""How far (relative) the parts of a layer's input may sum from the input itself before the split is called wrong;
in half precision, a few of the dtype's roundings (``model_core.kernel.rounding_tolerance``): each part was rounded
by the model."""


def sum_tolerance(dtype: torch.dtype) -> float:
    """``SUM_TOLERANCE`` for a model of ``dtype`` (a missing part is off by far more)."""
    return rounding_tolerance(SUM_TOLERANCE, dtype)


def inv_scale(lw: LayerWeights, resid: torch.Tensor) -> torch.Tensor:
    """1/rms (RMSNorm) or 1/σ (LayerNorm) of the whole residual at each position, with the norm's epsilon."""
    if lw.ln1_kind == "layer":
        return torch.rsqrt(resid.var(-1, unbiased=False, keepdim=True) + lw.ln1_eps)
    return torch.rsqrt(resid.pow(2).mean(-1, keepdim=True) + lw.ln1_eps)


def frozen_ln(ln: Any, x: torch.Tensor, parts: list[torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """A LayerNorm frozen at ``x`` applied to each part (centre, divide by σ(x), scale); and its β."""
    inv = torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + norm_eps(ln))
    gain = ln.weight.detach().to(x.device, torch.float64) if getattr(ln, "weight", None) is not None else 1.0
    out = [(p - p.mean(-1, keepdim=True)) * inv * gain for p in parts]
    beta = ln.bias.detach().to(x.device, torch.float64) if getattr(ln, "bias", None) is not None else None
    return out, beta


def model_softcap(output: Any, layer: int) -> float | None:
    caps = getattr(output, "layer_softcaps", None)
    if caps:
        return caps[layer]
    return getattr(output, "score_softcap", None)


def window(model: Any, layer: int) -> int | None:
    """The sliding window of layer ``layer``'s attention, or None (every key up to the query)."""
    cfg = model.config
    window = getattr(cfg, "sliding_window", None)
    if not window:
        return None
    types = getattr(cfg, "layer_types", None)
    if types is not None and types[layer] != "sliding_attention":
        return None
    return int(window)


