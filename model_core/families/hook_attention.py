"""Attention through the hook points: q, k, v (and with split inputs, each query head's own copies of the block's
input), the pattern, for transformers' attention function (``capture.py`` calls ``hooked_attention``)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from model_core.families.hooks import SPLIT_POINTS, HookRun
from model_core.kernel import apply_mask, attention_scores, weights_from_scores


def hooked_attention(run: HookRun, module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, project: Callable[..., Any] | None,
                     **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' attention-function contract, through the hook points: q, k, v (and with split inputs each query
    head's own copies of the block's input), the pattern. ``project(layer, x, kind, rope)`` is the family's own
    per-head projection (``project(inputs, rope)``, ``Family.project_heads`` bound to its model and layer) for split inputs.

    Shape: query (batch, head, pos, d_head); key, value (batch, kv_head, pos, d_head) ->
    out (batch, pos, head, d_head), weights (batch, head, q_pos, k_pos).
    """
    layer = int(module.layer_idx)
    b = f"blocks.{layer}"
    n_heads = query.shape[1]
    if run.split:
        if project is None:
            raise ValueError("Split inputs (hook_q_input, hook_k_input, hook_v_input) need a family that can project "
                             "each head alone.")
        resid = run.resid[layer]  # (batch, pos, d_model)
        inputs = []
        for p in SPLIT_POINTS:  # each query head's own copy, a node of its own for q, k and v (their own gradients)
            x = resid[:, :, None, :].expand(-1, -1, n_heads, -1)
            inputs.append(run.visit(f"{b}.{p}", x) if run.wants(f"{b}.{p}") else x)
        query, key, value = project(inputs, run.rope.get(layer))  # (batch, head, pos, d_head) each
    query = _visit_heads(run, f"{b}.attn.hook_q", query)
    key = _visit_heads(run, f"{b}.attn.hook_k", key)
    value = _visit_heads(run, f"{b}.attn.hook_v", value)
    pattern = (lambda w: run.visit(f"{b}.attn.hook_pattern", w)) if run.wants(f"{b}.attn.hook_pattern") else None
    return float32_attention(module, query, key, value, attention_mask, pattern=pattern, **kwargs)


def float32_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, *,
                      pattern: Callable[[torch.Tensor], torch.Tensor] | None = None,
                      **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention with its scores and weights in float32 whatever the model's precision (float64 kept): the score
    kernel, the mask, the softmax; the weights go back to the model's dtype only to weigh the values, as eager
    attention does. A bfloat16 model's pattern is then float32's to rounding of q and k, not of the scores.

    Shape: query (batch, head, pos, d_head); key, value (batch, kv_head, pos, d_head) ->
    out (batch, pos, head, d_head), weights (batch, head, q_pos, k_pos) float32 (or float64).
    """
    groups = query.shape[1] // key.shape[1]
    k_all = key.repeat_interleave(groups, dim=1) if groups > 1 else key
    v_all = value.repeat_interleave(groups, dim=1) if groups > 1 else value
    wide = torch.promote_types(query.dtype, torch.float32)
    scaling = kwargs.get("scaling")
    scores = attention_scores(query.to(wide), k_all.to(wide),
                              scale=query.shape[-1] ** -0.5 if scaling is None else scaling,
                              softcap=kwargs.get("softcap"))  # (batch, head, q_pos, k_pos)
    mask = None if attention_mask is None else attention_mask[:, :, :, : k_all.shape[-2]]  # bool or additive
    weights = weights_from_scores(apply_mask(scores, mask))
    if pattern is not None:
        weights = pattern(weights)
    out = torch.matmul(weights.to(v_all.dtype), v_all).transpose(1, 2)  # (batch, pos, head, d_head)
    return out, weights


def _visit_heads(run: HookRun, name: str, t: torch.Tensor) -> torch.Tensor:
    """Visit a (batch, head, pos, d_head) tensor as TransformerLens lays it out, (batch, pos, head, d_head)."""
    if not run.wants(name):
        return t
    return run.visit(name, t.transpose(1, 2)).transpose(1, 2)


def apply_rotary(module: Any, q: torch.Tensor, k: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The module's own rotary embedding (its modeling file's ``apply_rotary_pos_emb``), on its rotary dimensions
    (Phi: the first ``rotary_ndims``). Shape: (batch, head, pos, d_head) each."""
    if rope is None:
        return q, k
    cos, sin = rope
    fn = sys.modules[type(module).__module__].apply_rotary_pos_emb  # the family's own modeling file
    n = getattr(module, "rotary_ndims", None)
    if n is None or n == q.shape[-1]:
        return fn(q, k, cos, sin)
    q_rot, k_rot = fn(q[..., :n], k[..., :n], cos, sin)
    return torch.cat([q_rot, q[..., n:]], dim=-1), torch.cat([k_rot, k[..., n:]], dim=-1)
