"""The linear read-out behind direct logit attribution: the final norm frozen at one residual, the unembedding
direction of an answer (minus a foil), and each layer's attention output as the residual receives it.

Everything here maps a write into the residual stream at one position onto the logit (difference): with the norms'
statistics frozen, ``logit = direction · resid + bias``, and each part of ``resid`` gets ``direction · part``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from model_core.effects.norms import FrozenNorm, freeze
from model_core.gate import GATE


def to_cpu64(frozen: FrozenNorm) -> FrozenNorm:
    """A frozen norm on the CPU in float64 (the read-out is summed in float64 whatever the model's device)."""
    cast = lambda t: None if t is None else t.detach().to("cpu", torch.float64)
    return FrozenNorm(scale=cast(frozen.scale), weight=cast(frozen.weight), bias=cast(frozen.bias),
                      centred=frozen.centred)


def pull_back(frozen: FrozenNorm, direction: np.ndarray) -> np.ndarray:
    """The direction ``g`` with ``g · part == direction · frozen.apply(part)`` for every part (the adjoint).

    ``apply(p) = C(p) * scale * weight`` with ``C`` the centring (LayerNorm) or the identity (RMSNorm); both are
    symmetric, so ``g = C(direction * scale * weight)``.

    Shape: direction (d_model,) -> (d_model,) float64.
    """
    scaled = direction * (frozen.scale.reshape(-1)[0] * frozen.weight).numpy()
    return scaled - scaled.mean() if frozen.centred else scaled


def bias_of(frozen: FrozenNorm) -> np.ndarray | None:
    """The frozen norm's bias as float64 numpy, or None."""
    return None if frozen.bias is None else frozen.bias.numpy()


@dataclass(frozen=True)
class Readout:
    """The final norm frozen at one final residual, and the answer's (minus the foil's) unembedding.

    Attributes:
        direction: ``g`` with ``logit = g · resid + bias`` for the frozen final norm. Shape: (d_model,) float64.
        bias: the final norm's bias and the unembedding's bias on the answer (minus the foil).
        logit: the model's own logit (difference) at the residual, from its modules, before any final softcap.
        top_id: the model's top token there (a check that the model is the trace's).
    """

    direction: np.ndarray
    bias: float
    logit: float
    top_id: int


def unembedding_row(model: Any, answer_id: int, foil_id: int | None) -> tuple[np.ndarray, float]:
    """W_U[answer] (− W_U[foil]) as float64 and the unembedding bias on them (0 without one).

    Shape: -> (d_model,), float.
    """
    head = model.get_output_embeddings()
    w = head.weight.detach()
    row = w[answer_id].to("cpu", torch.float64)
    bias = getattr(head, "bias", None)
    b = 0.0 if bias is None else float(bias[answer_id])
    if foil_id is not None:
        row = row - w[foil_id].to("cpu", torch.float64)
        b -= 0.0 if bias is None else float(bias[foil_id])
    return row.numpy(), b


def final_readout(model: Any, family: Any, resid: np.ndarray, answer_id: int, foil_id: int | None) -> Readout:
    """Freeze the final norm at ``resid`` and pull the answer's (minus the foil's) unembedding back through it.

    Shape: resid (d_model,), the final residual at one position (before the final norm).
    """
    param = next(model.parameters())
    norm = family.final_norm(model)
    x = torch.from_numpy(np.array(resid)).to(device=param.device, dtype=param.dtype)
    row, b_unembed = unembedding_row(model, answer_id, foil_id)
    with GATE.turn(), torch.inference_mode():  # the model's final norm and unembedding run here
        frozen = to_cpu64(freeze(norm, x))
        logits = model.get_output_embeddings()(norm(x)).float()  # the model's own read-out, before any softcap
    logit = float(logits[answer_id] - (0.0 if foil_id is None else logits[foil_id]))
    bias = bias_of(frozen)
    return Readout(direction=pull_back(frozen, row), bias=b_unembed + (0.0 if bias is None else float(bias @ row)),
                   logit=logit, top_id=int(logits.argmax()))


def attention_output_norm(family: Any, model: Any, layer: int) -> Any | None:
    """The norm a block applies to its attention output before the residual sum (Gemma 2/3, OLMo 2), or None
    (``BlockParts.attn_post_norm``)."""
    return family.parts(model, layer).attn_post_norm


def output_projections(family: Any, model: Any) -> list[tuple[torch.Tensor, np.ndarray | None]]:
    """Every layer's output projection W_O as the model holds it (``Family.output_weights``, no copy), and its bias
    (GPT-2's and Phi's; None for most Llamas).

    Shape: -> layer pairs of (d_model, head * d_head) on the model's device, (d_model,) float64 or None.
    """
    out = []
    for layer, w in enumerate(family.output_weights(model)):
        bias = family.parts(model, layer).o_bias
        out.append((w.detach(), None if bias is None else bias.detach().to("cpu", torch.float64).numpy()))
    return out


def project(w: torch.Tensor, x: np.ndarray) -> np.ndarray:
    """``w @ x`` in the model's precision, back as float64 (a float64 copy of W_O costs more than the whole
    attribution). On the CPU numpy reads the weights in place. Shape: w (m, n), x (n,) -> (m,)."""
    if w.device.type == "cpu" and w.dtype == torch.float32:
        return (w.numpy() @ x.astype(np.float32)).astype(np.float64)
    t = torch.from_numpy(np.ascontiguousarray(x)).to(device=w.device, dtype=w.dtype)
    with torch.inference_mode():
        return (w @ t).to("cpu", torch.float64).numpy()


@dataclass(frozen=True)
class LayerReadout:
    """How one layer's attention output reaches the logit.

    Attributes:
        direction: ``g_l`` with ``effect = g_l · (W_O z)`` for any write of the layer's heads. Shape: (d_model,).
        written: the attention block's whole write into the residual (after Gemma's post-attention norm).
            Shape: (d_model,) float64.
        rest: what the layer adds that no head writes: the output bias (and a post-attention norm's bias).
    """

    direction: np.ndarray
    written: np.ndarray
    rest: float


def layer_readout(family: Any, model: Any, layer: int, output: np.ndarray, bias: np.ndarray | None,
                  direction: np.ndarray) -> LayerReadout:
    """Pull ``direction`` (the final read-out) back through layer ``layer``'s post-attention norm, if it has one.

    Args:
        output: the attention output W_O z + b at the position (before any post-attention norm). Shape: (d_model,).
        bias: the output projection's bias, or None.
        direction: the final read-out's direction. Shape: (d_model,).
    """
    norm = attention_output_norm(family, model, layer)
    if norm is None:
        rest = 0.0 if bias is None else float(bias @ direction)
        return LayerReadout(direction=direction, written=output, rest=rest)
    param = next(model.parameters())
    x = torch.from_numpy(output).to(device=param.device, dtype=param.dtype)
    with GATE.turn():  # the model's post-attention norm runs here
        frozen = to_cpu64(freeze(norm, x))
    pulled = pull_back(frozen, direction)
    norm_bias = bias_of(frozen)
    written = frozen.apply(torch.from_numpy(output)).numpy() + (0.0 if norm_bias is None else norm_bias)
    rest = (0.0 if bias is None else float(bias @ pulled)) + (0.0 if norm_bias is None else float(norm_bias @ direction))
    return LayerReadout(direction=pulled, written=written, rest=rest)


def mlp_write(family: Any, model: Any, layer: int, resid_pre: np.ndarray, resid_mid: np.ndarray) -> np.ndarray | None:
    """Block ``layer``'s MLP write into the residual stream at one position, from running the block's own MLP modules
    (its input norm, the MLP, any post-MLP norm) on one vector: an independent read of what the attribution otherwise
    gets as the layer's update minus the attention write. None for a post-norm block or one whose MLP has no input
    norm (OLMo 2).

    A pre-norm block's MLP reads ``resid_mid`` through ``ln2`` (then Gemma 2/3's ``mlp_post_norm`` on its output); a
    parallel block's (Phi) reads ``resid_pre`` through ``ln1``, as its attention does (``BlockParts``).

    Shape: resid_pre, resid_mid (d_model,) -> (d_model,) float64.
    """
    parts = family.parts(model, layer)
    if parts.post_norm or parts.mlp is None:
        return None
    norm, x = (parts.ln1, resid_pre) if parts.mlp_reads_resid_pre else (parts.ln2, resid_mid)
    if norm is None:
        return None
    param = next(model.parameters())
    t = torch.from_numpy(np.ascontiguousarray(x)).to(device=param.device, dtype=param.dtype)[None, None]
    with GATE.turn(), torch.inference_mode():  # the block's own MLP modules run here
        out = parts.mlp(norm(t))
        out = out if parts.mlp_post_norm is None else parts.mlp_post_norm(out)
    return out[0, 0].to("cpu", torch.float64).numpy()
