"""A norm with its statistics frozen at one residual: the affine map that splits a normed sum into its parts' shares.

A LayerNorm or RMSNorm is not linear, but with its scale (1/σ or 1/rms) fixed at the residual it is applied to, it is
an affine map: ``norm(x) = A x + b``. Direct logit attribution (a component's write through the final norm) and the
contribution graph of a post-norm block (BERT's LayerNorm after each residual sum, Gemma 2/3's norm on the attention
output) both apply ``A`` to each part, so the parts sum exactly to the normed whole minus ``b``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from model_core.families.parts import adds_one, norm_eps

CHECK_TOLERANCE = 1e-4
"""How far (relative) the frozen map may be from the module itself before the norm is called unsupported, both in
float32 at least (``freeze``)."""


@dataclass(frozen=True, eq=False)
class FrozenNorm:
    """``norm(x) = apply(x) + bias`` with the statistics of one residual ``x``.

    Shape:
        scale: (..., 1): 1/σ (LayerNorm) or 1/rms (RMSNorm) of each position of the residual it was frozen at.
        weight: (d_model,): the norm's gain as the module applies it (Gemma's ``1 + w``).
        bias: (d_model,) or None: the norm's bias (LayerNorm), the part of the output no component writes.
    """

    scale: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None
    centred: bool

    def apply(self, part: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        """The linear part of the frozen norm applied to one part of the residual.

        Args:
            part: (..., d_model), broadcastable against ``scale``.
            scale: a different broadcast of the frozen scale (e.g. ``scale[i]`` for many parts of position i).
        """
        s = self.scale if scale is None else scale
        centred = part - part.mean(dim=-1, keepdim=True) if self.centred else part
        return centred * s * self.weight


def _gain(module: Any, d_model: int, like: torch.Tensor) -> torch.Tensor:
    """The gain the module applies: its weight (Gemma's ``1 + w``), or ones for a norm without one
    (``LayerNorm(elementwise_affine=False)``)."""
    weight = getattr(module, "weight", None)
    if weight is None:
        return torch.ones(d_model, dtype=like.dtype, device=like.device)
    weight = weight.detach()
    return weight + 1.0 if adds_one(module) else weight  # Gemma's RMSNorms scale by (1 + w)


def _is_layer_norm(module: Any) -> bool:
    """A LayerNorm: torch's (with or without weight and bias), or any norm with a bias. (A class named LayerNorm
    without a bias may be an RMSNorm, T5's: it is tried as one, and the check below tells.)"""
    return isinstance(module, torch.nn.LayerNorm) or getattr(module, "bias", None) is not None


def _is_rms_norm(module: Any) -> bool:
    """An RMSNorm: torch's, or a class named so (Llama's, Gemma's...), or a module with a gain and an epsilon."""
    return (isinstance(module, getattr(torch.nn, "RMSNorm", ())) or "rmsnorm" in type(module).__name__.lower()
            or (getattr(module, "weight", None) is not None and _eps(module) is not None))


def _eps(module: Any) -> float | None:
    """A norm's epsilon (``model_core.families.parts.norm_eps``), or None where it has none (torch's
    ``RMSNorm(eps=None)``)."""
    try:
        return norm_eps(module)
    except ValueError:
        return None


def _frozen_at(module: Any, x: torch.Tensor) -> FrozenNorm:
    """The module's map frozen at ``x``: the statistics in float32 at least, the map in ``x``'s dtype.

    Raises:
        ValueError: the module is neither norm.
    """
    xf = x.float()
    d_model = int(x.shape[-1])
    bias = getattr(module, "bias", None)
    if _is_layer_norm(module):
        eps = _eps(module)
        eps = 1e-5 if eps is None else eps
        var = xf.var(dim=-1, keepdim=True, unbiased=False)
        return FrozenNorm(scale=torch.rsqrt(var + eps).to(x.dtype), weight=_gain(module, d_model, x),
                          bias=None if bias is None else bias.detach(), centred=True)
    if _is_rms_norm(module):
        eps = _eps(module)
        eps = float(torch.finfo(xf.dtype).eps if eps is None else eps)  # torch's RMSNorm(eps=None)
        rms = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
        return FrozenNorm(scale=rms.to(x.dtype), weight=_gain(module, d_model, x), bias=None, centred=False)
    raise ValueError(f"{type(module).__name__} is not a LayerNorm or an RMSNorm, so its parts cannot be "
                     "attributed: direct attribution and contributions need a model whose norms are one of them.")


def _float_copy(module: Any) -> Any:
    """The norm with its parameters and float buffers in float32, sharing nothing it holds with ``module``: a shallow
    copy with dicts of its own (a deep copy would follow whatever a model's module refers to)."""
    reference = copy.copy(module)
    reference._parameters = {name: None if p is None else p.detach().float() for name, p in module._parameters.items()}
    reference._buffers = {name: b.float() if b is not None and b.is_floating_point() else b
                          for name, b in module._buffers.items()}
    return reference


def freeze(module: Any, x: torch.Tensor) -> FrozenNorm:
    """Freeze ``module`` (a LayerNorm or an RMSNorm, with or without a gain and a bias) at the residual ``x`` and
    check the map against the module.

    The check is of the map's form, so it runs in float32 at least: a half-precision model's norm is checked as a
    float32 copy of the module on ``x`` in float32 (a few kB), within ``CHECK_TOLERANCE``. In bfloat16 itself the two
    would round each product in another order, which a check must allow (8 epsilons, 6% of the largest output) and
    under which a norm of a slightly other form would pass.

    Shape: x (..., d_model).

    Raises:
        ValueError: the module is neither norm, or the frozen map does not reproduce it (an unsupported norm).
    """
    x = x.detach()
    frozen = _frozen_at(module, x)
    if x.dtype in (torch.bfloat16, torch.float16):
        reference, at = _float_copy(module), x.float()
        checked = _frozen_at(reference, at)
    else:
        reference, at, checked = module, x, frozen
    with torch.no_grad():  # the copy's own forward: the model's hooks on its norm are not run twice
        expected = reference(at) if reference is module else reference.forward(at)
    got = checked.apply(at) + (0 if checked.bias is None else checked.bias)
    scale = expected.abs().max().clamp_min(1e-6)
    if float((got - expected).abs().max() / scale) > CHECK_TOLERANCE:
        raise ValueError(f"{type(module).__name__} is not a norm this tool can freeze (its frozen map differs from "
                         "the module); direct attribution and contributions need a LayerNorm or an RMSNorm.")
    return frozen
