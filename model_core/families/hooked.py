"""Run a model through its named hook points: ``run_with_hooks`` (TransformerLens's verb) caches points by name,
applies hook functions that read or write them, and keeps gradients at them; every pass holds a turn of the gate."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from model_core.families import family_of
from model_core.families.hook_install import open_run
from model_core.families.hooks import HookFn, HookRun, check_name, point_names


@dataclass(frozen=True, eq=False)
class HookedOutput:
    """One hooked pass: the model's output and the cached points.

    Shape: logits (batch, pos, vocab) for a decoder, (batch, num_labels) for the chapter-3 encoder, else None;
    cache: point name -> tensor (shapes in ``model_core.families.hooks``).
    """

    logits: torch.Tensor | None
    cache: dict[str, torch.Tensor]
    output: Any
    rope: dict[int, Any] | None = None  # each layer's rotary (cos, sin), with ``keep_rope``


def model_points(model: Any) -> list[str]:
    """Every hook point ``model`` has, in the order a pass reaches them."""
    family = family_of(model)
    parts, embed = family.parts(model, 0), family.embed_parts(model)
    return point_names(family.n_layers(model.config), pos_embed=embed.pos_embed is not None,
                       type_embed=embed.type_embed is not None, parallel=parts.parallel,
                       split=hasattr(family, "project_heads"), ln1=(parts.ln1 or parts.post_ln1) is not None,
                       ln_final=embed.final_norm is not None)


def run_with_hooks(model: Any, input_ids: torch.Tensor, *, names: Iterable[str] = (),
                   hooks: Iterable[tuple[str, HookFn]] = (), grad: bool = False, split: bool | None = None,
                   attention_mask: torch.Tensor | None = None, token_type_ids: torch.Tensor | None = None,
                   compact: bool = False, keep_rope: bool = False) -> HookedOutput:
    """Run ``model`` once on ``input_ids`` (batch, pos) through its hook points.

    Args:
        names: the points to cache (``model_core.families.hooks.point_names`` lists a model's).
        hooks: (point, function) pairs; a function gets (tensor, HookPoint) and may return a replacement.
        grad: run with autograd: the cached tensors keep ``.grad`` after the caller's ``backward()``.
        split: compute each query head's q, k, v from its own copy of the input (on by default when a
            ``hook_*_input`` point is named).
        keep_rope: keep each layer's rotary (cos, sin) in ``HookedOutput.rope``.
        compact: attend with sdpa and never form the n x n pattern (a long prompt); hook_pattern and split inputs
            are then refused.

    Raises:
        ValueError: an unknown point, a read-only point hooked, or a point this pass cannot reach.
    """
    family = family_of(model)
    cfg = model.config
    n_layers = family.n_layers(cfg)
    names, hooks = list(names), list(hooks)
    for name in [*names, *(n for n, _ in hooks)]:
        check_name(name, n_layers)
    device = next(model.parameters()).device
    if input_ids.device != device:  # moved only when elsewhere: a host-to-device copy, never a wait in a loop
        input_ids = input_ids.to(device)
    if token_type_ids is not None and token_type_ids.device != device:
        token_type_ids = token_type_ids.to(device)
    types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
    run = HookRun(names, hooks, grad=grad, split=split, keep_rope=keep_rope)
    with open_run(model, family, run):
        if family.name == "custom":
            out = family.forward(model, input_ids, types, attention_mask, vectors=False, hidden=False, grad=grad)
            logits = out.class_logits
        else:
            out = family.forward(model, input_ids, types, attention_mask, vectors=False, hidden=False,
                                 logits=family.is_decoder, grad=grad, compact=compact)
            logits = out.lm_logits
    missing = [n for n in names if n not in run.cache]
    if missing:
        raise ValueError(f"This pass did not reach {', '.join(missing[:5])}"
                         f"{' ...' if len(missing) > 5 else ''}: this family has no such point "
                         "(a parallel block has no hook_resid_mid; an encoder has no ln_final).")
    return HookedOutput(logits=logits, cache=run.cache, output=out, rope=run.rope)
