"""An attention function registered with transformers' ``AttentionInterface`` that records what a decoder's
attention sees and can switch heads off.

transformers calls it in every attention layer with the queries and keys after the rotary embedding and the keys
and values of the key/value heads (before grouped-query attention repeats them), the mask and the scaling. It
records them, switches off the heads a gate says, and runs the model's own eager attention, so the weights are
exactly transformers'. Models are loaded eager and then switched to this function (``use_capture``); with no
recorder active it only delegates, so a cached model stays usable by any caller.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from model_core.families.hook_attention import float32_attention, hooked_attention
from model_core.families.hooks import current_run
from model_core.gate import checkpoint
from model_core.kernel import allowed_from_mask

CAPTURE = "attention_explorer"
HALF = (torch.bfloat16, torch.float16)

_RECORDER: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar("ae_recorder", default=None)


@dataclass
class Recorder:
    """What one forward pass recorded, per layer index; and the head gate it applied.

    Shape: gate (layer, head) float or None; each recorded tensor (batch, head or kv_head, pos, d_head);
    weights (batch, head, q_pos, k_pos); masks (batch, 1, q_pos, k_pos) additive.
    """

    vectors: bool = True
    gate: torch.Tensor | None = None
    queries: dict[int, torch.Tensor] = field(default_factory=dict)
    keys: dict[int, torch.Tensor] = field(default_factory=dict)
    values: dict[int, torch.Tensor] = field(default_factory=dict)
    weights: dict[int, torch.Tensor] = field(default_factory=dict)
    masks: dict[int, torch.Tensor | None] = field(default_factory=dict)
    scaling: dict[int, float] = field(default_factory=dict)
    residual: list[torch.Tensor] | None = None  # the residual stream: the first layer's input, then each layer's output
    last_only: bool = False  # keep only the latest layer output in ``residual`` (a compact pass's predictions)
    softcap: dict[int, float | None] = field(default_factory=dict)
    # Compact: attention runs through sdpa and no weights are kept; queries and keys are (model_core.compact.trace).
    compact: bool = False
    on_layer: Any = None  # called with the layer index after each attention layer (progress)
    plain_masks: dict[int, bool] = field(default_factory=dict)  # mask data_ptr -> the module's own default mask
    only: int | None = None  # record this layer alone (the block walk), or every layer


def _eager(module: torch.nn.Module):
    """The eager attention of the module's own modeling file (each family defines its own)."""
    fn = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if fn is None:  # pragma: no cover - every supported family defines one
        raise RuntimeError(f"{type(module).__name__} has no eager_attention_forward; this family is not supported.")
    return fn


def capture_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' attention-function signature: records, gates, and runs the family's eager attention. Each layer
    is a point where the app's Stop ends the pass (``model_core.gate.checkpoint``)."""
    checkpoint()
    rec = _RECORDER.get()
    run = current_run()
    hooked = run is not None and run.attention_wanted(int(module.layer_idx))
    if rec is not None and rec.compact:
        if hooked:
            query, key, value = _compact_points(run, module, query, key, value)
        return _compact_attention(rec, module, query, key, value, attention_mask, **kwargs)
    if hooked:
        out, weights = hooked_attention(run, module, query, key, value, attention_mask,
                                        getattr(module, "_ae_project", None), **kwargs)
    elif query.dtype in HALF and rec is not None:  # a recorded pattern is float32's, never a half-precision one
        out, weights = float32_attention(module, query, key, value, attention_mask, **kwargs)
    else:
        out, weights = _eager(module)(module, query, key, value, attention_mask, **kwargs)
    if rec is None:
        return out, weights
    layer = int(module.layer_idx)
    if rec.gate is not None:
        g = rec.gate[layer].to(out.dtype)  # (head,)
        out = out * g[None, None, :, None]  # out is (batch, pos, head, d_head): a head's output before W_O
        weights = weights * g[None, :, None, None]
    if rec.only is not None and layer != rec.only:
        return out, weights
    rec.weights[layer] = weights
    rec.masks[layer] = attention_mask
    scaling = kwargs.get("scaling")
    rec.scaling[layer] = float(query.shape[-1] ** -0.5 if scaling is None else scaling)
    rec.softcap[layer] = kwargs.get("softcap")  # Gemma 2 caps its scores: cap * tanh(score / cap)
    if rec.vectors:
        rec.queries[layer], rec.keys[layer], rec.values[layer] = query, key, value
    return out, weights


def _compact_points(run: Any, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                    value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A compact pass's hook points: q, k and v (it never forms the n x n pattern, nor splits inputs)."""
    b = f"blocks.{int(module.layer_idx)}"
    if run.split or run.wants(f"{b}.attn.hook_pattern"):
        raise ValueError("A long prompt's compact pass never forms the n x n pattern nor splits each head's input: "
                         "hook_pattern and hook_q_input/k_input/v_input need the full form (a shorter text); ask for "
                         "q, k, v, z, the residual stream and the norms' scales instead.")
    out = []
    for name, t in (("hook_q", query), ("hook_k", key), ("hook_v", value)):
        out.append(run.visit(f"{b}.attn.{name}", t.transpose(1, 2)).transpose(1, 2) if run.wants(f"{b}.attn.{name}")
                   else t)
    return out[0], out[1], out[2]


def _compact_attention(rec: Recorder, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                       value: torch.Tensor, attention_mask: torch.Tensor | None,
                       **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Keep the queries, the key/value heads' keys, the mask and the scaling; attend with sdpa, keeping no weights.

    Gemma 2 caps its scores, which sdpa cannot do: its layers run eager and drop the weights at once.
    """
    layer = int(module.layer_idx)
    softcap = kwargs.get("softcap")
    if softcap is None:
        # A plain causal (or, in an encoder, all-open) mask is left to sdpa's own is_causal path, which never
        # builds the n x n mask; a sliding window or padding is passed as it is.
        plain = attention_mask is None or _is_plain(rec, module, attention_mask)
        out, _ = sdpa_attention_forward(module, query, key, value, None if plain else attention_mask, **kwargs)
    else:
        out, _ = _eager(module)(module, query, key, value, attention_mask, **kwargs)
    scaling = kwargs.get("scaling")
    rec.scaling[layer] = float(query.shape[-1] ** -0.5 if scaling is None else scaling)
    rec.softcap[layer] = softcap
    rec.queries[layer], rec.keys[layer], rec.masks[layer] = query, key, attention_mask
    if rec.on_layer is not None:
        rec.on_layer(layer)
    return out, None


def _is_plain(rec: Recorder, module: torch.nn.Module, mask: torch.Tensor) -> bool:
    """Whether ``mask`` (batch 1, additive or bool) is what sdpa does with no mask: causal for a causal module,
    all open otherwise. Checked once per mask tensor (layers of one kind share one)."""
    key = mask.data_ptr()
    if key not in rec.plain_masks:
        allowed = allowed_from_mask(mask[0, 0])
        n_q, n_k = allowed.shape
        expected = torch.ones(n_q, n_k, dtype=torch.bool, device=allowed.device)
        if getattr(module, "is_causal", False):
            expected = expected.tril(n_k - n_q)
        rec.plain_masks[key] = mask.shape[0] == 1 and bool(torch.equal(allowed, expected))
    return rec.plain_masks[key]


def _register() -> None:
    AttentionInterface.register(CAPTURE, capture_attention)
    AttentionMaskInterface.register(CAPTURE, eager_mask)  # the same additive mask eager attention gets


_register()


def _first_input(_module, args, kwargs) -> None:
    rec = _RECORDER.get()
    if rec is not None and rec.residual is not None and not rec.last_only:
        rec.residual.append(kwargs["hidden_states"] if "hidden_states" in kwargs else args[0])


def _layer_output(_module, _args, output) -> None:
    rec = _RECORDER.get()
    if rec is not None and rec.residual is not None:
        if rec.last_only:
            rec.residual.clear()  # the earlier layers' outputs are freed as the pass goes
        rec.residual.append(output[0] if isinstance(output, tuple) else output)


def use_capture(model: Any, layers: list[torch.nn.Module]) -> Any:
    """Switch a model loaded with eager attention to the capturing function (same numbers, same speed), and hook
    its ``layers`` once for the residual stream.

    The hooks stay on the model and, like the attention function, record only into the recorder of the thread
    that runs the pass: sessions sharing one cached model never see each other's tensors (hooks added per pass
    would fire for every thread's pass).
    """
    model.set_attn_implementation(CAPTURE)
    layers[0].register_forward_pre_hook(_first_input, with_kwargs=True)
    for layer in layers:
        layer.register_forward_hook(_layer_output)
    return model


def current_recorder() -> Recorder | None:
    """The recorder of this thread's pass, if one is recording."""
    return _RECORDER.get()


@contextlib.contextmanager
def recording(vectors: bool = True, gate: torch.Tensor | None = None, hidden: bool | str = False, *,
              compact: bool = False, on_layer: Any = None, only: int | None = None) -> Iterator[Recorder]:
    """Record the attention layers (and with ``hidden`` the residual stream; ``hidden="last"`` the last layer's
    output alone) of the forward passes run inside the block, in this thread only. ``compact`` keeps queries and
    keys but no weights, and attends with sdpa; ``only`` records that one layer. (Reading or replacing a head's
    output is the hook layer's ``blocks.{l}.attn.hook_z``, ``model_core.families.hooks``.)"""
    if compact and gate is not None:
        raise ValueError("A compact trace cannot switch heads off; trace the full form for that.")
    rec = Recorder(vectors=vectors, gate=gate, residual=[] if hidden else None, compact=compact, on_layer=on_layer,
                   only=only, last_only=hidden == "last")
    token = _RECORDER.set(rec)
    try:
        yield rec
    finally:
        _RECORDER.reset(token)
