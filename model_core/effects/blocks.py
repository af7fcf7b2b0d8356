"""How each family's attention and MLP outputs join the residual stream, for the contribution graph.

A block's output at query ``i`` is split into parts (Ferrando & Voita 2024): the attention block's parts are each
(key ``j``, head ``h``) term ``αᵢⱼʰ·W_Oʰ·vⱼʰ`` and the residual entering the block; the MLP block's are its output and
the residual after attention. Families differ in how those parts reach the residual:

- pre-norm decoders (GPT-2, Llama, Qwen, Mistral, Gemma 1, Phi-3) and the chapter-3 encoder with pre-LN:
  ``resid_mid = resid_pre + Σ terms + b_O``; Phi runs attention and MLP side by side, so there
  ``resid_mid = resid_pre + attention output`` by definition;
- Gemma 2/3 (and OLMo 2) normalise the attention output before the sum: the norm is frozen at the attention output
  (``model_core.effects.norms.freeze``) and each term goes through its linear part;
- post-LN encoders (BERT, the chapter-3 encoder with post-LN): ``resid_mid = LN(resid_pre + attention output)``;
  the LayerNorm is frozen at its input and every part (terms and residual) goes through its linear part (as ALTI,
  Ferrando et al. 2022); the MLP block likewise with its own LayerNorm. A frozen bias is never a part (``rest``).

Everything here is derived from a trace's weights, values and residual stream plus the model's own weights: no new
forward pass at lengths a full trace holds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from model_core.effects.norms import freeze
from model_core.families.parts import BlockParts
from model_core.gate import GATE
from model_core.models.run_memory import device_of


@dataclass(frozen=True, eq=False)
class AttentionJoin:
    """The attention block at some query rows: its whole, its residual part, and how each term is mapped.

    A term's part is ``scale[i] · gain ⊙ centre(αᵢⱼʰ W_Oʰ vⱼʰ)`` (``directions`` applies gain and centring; the
    walk folds ``scale`` into the weights). ``Σ parts + residual + rest = whole``.

    Shape:
        scale: (rows,); residual, whole, rest: (rows, d_model); gain: (d_model,) or None.
    """

    scale: torch.Tensor
    residual: torch.Tensor
    whole: torch.Tensor
    rest: torch.Tensor
    gain: torch.Tensor | None = None
    centred: bool = False

    def directions(self, raw: torch.Tensor) -> torch.Tensor:
        """Map raw term directions ``W_Oʰ vⱼʰ`` as every part is mapped (gain, centring; no per-row scale).

        Shape: (head, d_model, key) -> (head, d_model, key).
        """
        out = raw - raw.mean(dim=1, keepdim=True) if self.centred else raw
        return out if self.gain is None else out * self.gain[None, :, None]


@dataclass(frozen=True, eq=False)
class MlpJoin:
    """The MLP block at some rows: its two parts and its whole, ``mlp + residual + rest = whole``.

    Shape: every field (rows, d_model).
    """

    mlp: torch.Tensor
    residual: torch.Tensor
    whole: torch.Tensor
    rest: torch.Tensor


@dataclass(frozen=True, eq=False)
class _Layer:
    """One block's modules as the contribution graph needs them."""

    o_weight: torch.Tensor  # (d_model, head * d_head)
    o_bias: torch.Tensor | None
    attn_norm: Any = None  # a norm on the attention output before the sum (Gemma 2/3)
    post_ln1: Any = None  # LN(resid_pre + attention output) (post-LN encoders)
    ffn: Callable[[torch.Tensor], torch.Tensor] | None = None  # the MLP of a post-LN block (from resid_mid)
    post_ln2: Any = None
    v_of: Callable[[torch.Tensor], torch.Tensor] | None = None  # resid_pre -> (pos, kv_head * d_head) values


class BlockMap:
    """One model's blocks as the contribution graph reads them (every family of ``model_core.families``).

    Args:
        family: the model's adapter.
        model: the loaded model (transformers or the chapter-3 encoder).
    """

    def __init__(self, family: Any, model: Any) -> None:
        self.family, self.model = family, model
        self.device = device_of(model)  # where the graph computes: every tensor handed in is moved here
        config = model.config
        self.n_layers, self.n_heads = family.n_layers(config), family.n_heads(config)
        self.kv_heads = torch.as_tensor(family.kv_heads(config), device=self.device)
        weights = family.output_weights(model)
        self.d_head = int(weights[0].shape[1]) // self.n_heads
        self._layers = [_layer_of(family.parts(model, i), weights[i]) for i in range(self.n_layers)]

    # -- the terms -------------------------------------------------------------------------
    @torch.no_grad()
    def raw_directions(self, layer: int, values: torch.Tensor) -> torch.Tensor:
        """Each (head, key) term's direction ``W_Oʰ vⱼʰ`` before any norm, keys last.

        Shape: values (head, pos, d_head) -> (head, d_model, pos).
        """
        w = self._layers[layer].o_weight.float().view(-1, self.n_heads, self.d_head)  # (d_model, head, d_head)
        return torch.matmul(w.transpose(0, 1), values.float().transpose(1, 2))  # (head, d_model, pos)

    @torch.no_grad()
    def heads_out(self, layer: int, z: torch.Tensor) -> torch.Tensor:
        """The output projection with its bias applied to the heads' outputs. Shape: (rows, head, d_head) ->
        (rows, d_model)."""
        spec = self._layers[layer]
        out = z.float().reshape(len(z), -1) @ spec.o_weight.float().T
        return out if spec.o_bias is None else out + spec.o_bias.float()

    # -- the blocks ------------------------------------------------------------------------
    @torch.no_grad()
    def attention(self, layer: int, z: torch.Tensor, resid_pre: torch.Tensor) -> AttentionJoin:
        """The attention block at some rows, from the heads' outputs there (``z = Σⱼ αᵢⱼʰ vⱼʰ``).

        Shape: z (rows, head, d_head), resid_pre (rows, d_model).
        """
        with GATE.turn():  # the model's own modules (norms) run here: one turn of the route's gate
            return self._attention(layer, z, resid_pre)

    def _attention(self, layer: int, z: torch.Tensor, resid_pre: torch.Tensor) -> AttentionJoin:
        spec = self._layers[layer]
        resid_pre = resid_pre.float()
        out = self.heads_out(layer, z)
        bias = torch.zeros_like(out) if spec.o_bias is None else spec.o_bias.float().expand_as(out)
        ones = torch.ones(len(out), dtype=out.dtype, device=out.device)
        if spec.post_ln1 is not None:  # post-LN: every part through the LayerNorm frozen at its input
            x = (resid_pre + out).to(spec.o_weight.dtype)  # the model's precision: a half LayerNorm takes no float32
            norm = freeze(spec.post_ln1, x)
            whole = spec.post_ln1(x).float()
            rest = norm.apply(bias) + norm.bias.float()
            return AttentionJoin(norm.scale[:, 0].float(), norm.apply(resid_pre), whole, rest,
                                 norm.weight.float(), norm.centred)
        if spec.attn_norm is not None:  # Gemma 2/3: the attention output normed before the sum
            x = out.to(spec.o_weight.dtype)
            norm = freeze(spec.attn_norm, x)
            rest = norm.apply(bias) + (0 if norm.bias is None else norm.bias.float())
            whole = resid_pre + spec.attn_norm(x).float()
            return AttentionJoin(norm.scale[:, 0].float(), resid_pre, whole, rest, norm.weight.float(),
                                 norm.centred)
        return AttentionJoin(ones, resid_pre, resid_pre + out, bias)

    @torch.no_grad()
    def mlp(self, layer: int, resid_mid: torch.Tensor, resid_post: torch.Tensor) -> MlpJoin:
        """The MLP block at some rows. Shape: resid_mid, resid_post (rows, d_model)."""
        spec = self._layers[layer]
        resid_mid, resid_post = resid_mid.float(), resid_post.float()
        if spec.post_ln2 is None:  # the MLP output is what the block added
            return MlpJoin(resid_post - resid_mid, resid_mid, resid_post, torch.zeros_like(resid_mid))
        with GATE.turn():  # the model's MLP and LayerNorm run here, in its precision
            dtype = spec.o_weight.dtype
            ffn = spec.ffn(resid_mid.to(dtype)).float()
            norm = freeze(spec.post_ln2, (resid_mid + ffn).to(dtype))
            return MlpJoin(norm.apply(ffn), norm.apply(resid_mid), resid_post,
                           norm.bias.float().expand_as(resid_mid).clone())

    # -- values of a compact pass ----------------------------------------------------------
    @torch.no_grad()
    def values(self, layer: int, resid_pre: torch.Tensor) -> torch.Tensor:
        """Each query head's value, from the block's input (a compact pass keeps no values).

        Shape: resid_pre (pos, d_model) -> (head, pos, d_head).

        Raises:
            ValueError: this family's values cannot be recomputed (the chapter-3 encoder is always traced in full).
        """
        spec = self._layers[layer]
        if spec.v_of is None:
            raise ValueError("The chapter-3 encoder is traced in full; its contributions need no compact pass.")
        with GATE.turn():  # the model's norm and value projection over every position: one turn of the gate
            # in the model's precision: a half-precision norm or projection does not take float32 (GPT-2's LayerNorm)
            x = resid_pre.to(spec.o_weight.dtype)
            v = spec.v_of(x).float().view(len(resid_pre), -1, self.d_head).transpose(0, 1)  # (kv, pos, d_h)
        return v.index_select(0, self.kv_heads)


def _layer_of(parts: BlockParts, o_weight: torch.Tensor) -> _Layer:
    """One block's modules as the graph needs them, from the family's ``BlockParts``."""
    bias = parts.o_bias
    if parts.post_norm:  # BERT, the chapter-3 encoder with post-LN: the MLP runs again from resid_mid
        return _Layer(o_weight.detach(), bias, post_ln1=parts.post_ln1, ffn=parts.mlp, post_ln2=parts.post_ln2,
                      v_of=parts.values)
    # Gemma 2/3 and OLMo 2 normalise the attention output before the sum (attn_post_norm); the others do not.
    return _Layer(o_weight.detach(), bias, attn_norm=parts.attn_post_norm, v_of=parts.values)
