"""Run any family's model once on an encoded input and collect its AttentionTrace: the one forward route.

Every family's adapter (``model_core.families``) runs the model and reports the same ``ForwardOutput``; this module
turns a batch of one into a trace, holding a turn of the route's gate (``model_core.gate``) until the trace's
arrays are numpy. Every other pass calls the same ``Family.forward``; a decoder's next-token predictions, wherever
they are kept, come from ``top_predictions``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from model_core.families import Family, ForwardOutput, family_of
from model_core.families.encoding import EncodedInput, InputError
from model_core.gate import GATE
from model_core.models.loading import LoadedModel
from model_core.settings import load_settings
from model_core.trace.trace import AttentionTrace
from model_core.trace.value_norms import value_norms

TOP_K = 10
"""How many next-token predictions a decoder's trace keeps per position."""
PREDICTION_CHUNK = 256
"""Positions unembedded at once: 256 x a 49,152-token vocabulary is 50 MB, not 800 MB for 4,096 positions."""


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A tensor as a float32 numpy array on the CPU (what traces and runs keep)."""
    return t.detach().to("cpu", torch.float32).numpy()


def to_host(tensors: list[torch.Tensor], *, pack: bool = False) -> list[np.ndarray]:
    """Several tensors as numpy arrays on the CPU, float tensors as float32, with one copy a dtype.

    On an accelerator the tensors are packed into one buffer a dtype (on the device) and copied over together: one
    transfer and one wait, not one a tensor. On the CPU each is a view already, and packing would only copy.

    Args:
        pack: a few small tensors of any dtypes (a generation step's choice and candidates) as one float64 buffer,
            one copy on any device; every array comes back float64 (exact for float32 numbers and for integers
            below 2^53: the caller casts them back).
    """
    tensors = [t.detach() for t in tensors]
    if pack:
        flat = torch.cat([t.reshape(-1).to(torch.float64) for t in tensors]).numpy(force=True)  # the one copy
        bounds = np.cumsum([0] + [t.numel() for t in tensors])
        return [flat[a:b].reshape(tuple(t.shape)) for t, a, b in zip(tensors, bounds[:-1], bounds[1:])]
    tensors = [t.float() if t.is_floating_point() else t for t in tensors]
    if all(t.device.type == "cpu" for t in tensors):
        return [t.numpy() for t in tensors]
    out: list[np.ndarray | None] = [None] * len(tensors)
    for dtype in dict.fromkeys(t.dtype for t in tensors):
        which = [i for i, t in enumerate(tensors) if t.dtype == dtype]
        flat = torch.cat([tensors[i].reshape(-1) for i in which]).cpu().numpy()  # (Σ numel,): the one copy
        start = 0
        for i in which:
            n = tensors[i].numel()
            out[i] = flat[start:start + n].reshape(tuple(tensors[i].shape))
            start += n
    return out  # type: ignore[return-value]


def _input_fields(encoded: EncodedInput) -> dict:
    """The trace's fields that describe its input."""
    return dict(tokens=encoded.tokens, token_ids=encoded.input_ids[0].numpy().astype(np.int64),
                token_type_ids=encoded.token_type_ids[0].numpy().astype(np.int64),
                sentence_b_start=encoded.sentence_b_start)


def full_trace_bytes(n_layers: int, n_heads: int, n_tokens: int) -> int:
    """Bytes of a full trace's weights: layer x head x n² float32."""
    return 4 * n_layers * n_heads * n_tokens * n_tokens


def check_full_size(n_layers: int, n_heads: int, n_tokens: int, full_trace_mb: int | None = None) -> None:
    """Refuse a full trace whose weights (layer x head x n² float32) would pass AE_FULL_TRACE_MB.

    Raises:
        InputError: with the size, the limit, and the compact form to use instead.
    """
    limit = load_settings().full_trace_mb if full_trace_mb is None else full_trace_mb
    size = full_trace_bytes(n_layers, n_heads, n_tokens)
    if size > limit * 1e6:
        raise InputError(f"A full trace of these {n_tokens} tokens would hold {size / 1e6:,.0f} MB of attention weights "
                         f"({n_layers} layers x {n_heads} heads x {n_tokens}²), over AE_FULL_TRACE_MB = {limit}. "
                         "Trace it in compact form (the app does so by itself; on the command line: export --compact), "
                         "shorten it, or raise AE_FULL_TRACE_MB.")


def head_gate(head_mask: np.ndarray | None, n_layers: int, n_heads: int, device: torch.device) -> torch.Tensor | None:
    """A (layer, head) 0/1 float gate from a bool head mask, or None for all heads on.

    Raises:
        ValueError: the mask's shape is not the model's (layer, head).
    """
    if head_mask is None:
        return None
    hm = np.asarray(head_mask, dtype=np.float32)
    if hm.shape != (n_layers, n_heads):
        raise ValueError(f"head_mask has shape {hm.shape}; it must be (layer, head) = ({n_layers}, {n_heads}).")
    return torch.from_numpy(hm).to(device)


def _per_query_head(tensors: list[torch.Tensor], kv_heads: torch.Tensor) -> torch.Tensor:
    """Stack layers of batch one, each key/value head repeated for the query heads that read it.

    Shape: layer tensors of (1, kv_head, pos, d_head) -> (layer, head, pos, d_head).
    """
    return torch.stack([t[0].index_select(0, kv_heads) for t in tensors])


def top_tokens(probs: torch.Tensor, k: int, tokenizer: Any = None) -> tuple[np.ndarray, np.ndarray, tuple | None]:
    """The ``k`` most likely tokens of each distribution, best first, and their text when a tokenizer is given.

    Shape: probs (..., vocab) -> ids (..., k) int64, probs (..., k) float32 (float64 kept), strings as nested tuples.
    """
    top = probs.topk(min(k, probs.shape[-1]), dim=-1)
    ids, values = to_host([top.indices, top.values])
    ids = ids.astype(np.int64)
    return ids, values, decode_top(ids, tokenizer)


def decode_top(ids: np.ndarray, tokenizer: Any = None) -> tuple | None:
    """Each id's text (nested tuples shaped as ``ids``), or None without a tokenizer.

    Each distinct id is decoded once, in one ``batch_decode`` (a fast tokenizer's own loop): a 512-token trace's
    5,120 predictions hold a few thousand ids, and decoding them one call each was the trace's largest step left on
    the host once a GPU runs the pass."""
    if tokenizer is None:
        return None
    ids = np.asarray(ids)
    distinct, where = np.unique(ids, return_inverse=True)
    text = np.empty(len(distinct), dtype=object)
    text[:] = tokenizer.batch_decode(distinct.reshape(-1, 1).tolist())
    rows = text[where.reshape(ids.shape)].tolist()
    return tuple(rows) if ids.ndim == 1 else tuple(tuple(row) for row in rows)


@torch.inference_mode()
def top_on_device(family: Family, model: Any, residual: torch.Tensor, k: int = TOP_K,
                  chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``top_predictions``' ids and probabilities, left on the model's device (``chunk`` positions unembedded at
    a time, the results joined there).

    Shape: residual (pos, hidden) -> ids (pos, k) int64, probs (pos, k) float32.
    """
    chunk = PREDICTION_CHUNK if chunk is None else chunk
    ids, probs = [], []
    for r0 in range(0, len(residual), chunk):
        p = torch.softmax(family.unembed(model, residual[r0:r0 + chunk]).float(), dim=-1)
        top = p.topk(min(k, p.shape[-1]), dim=-1)
        ids.append(top.indices)
        probs.append(top.values)
    return torch.cat(ids), torch.cat(probs)


def top_predictions(family: Family, model: Any, residual: torch.Tensor, k: int = TOP_K, tokenizer: Any = None,
                    chunk: int | None = None) -> tuple[np.ndarray, np.ndarray, tuple | None]:
    """A decoder's top ``k`` next tokens at every position of its last layer's output: the final norm, the
    unembedding and Gemma 2's final-logit softcap (``DecoderFamily.unembed``), ``chunk`` positions at a time.

    Shape: residual (pos, hidden) -> ids (pos, k) int64, probs (pos, k) float32, strings (pos, k) or None.
    """
    ids, probs = to_host(list(top_on_device(family, model, residual, k, chunk)))
    ids = ids.astype(np.int64)
    return ids, probs.astype(np.float32), decode_top(ids, tokenizer)


@torch.no_grad()
def trace_model(family: Family, model: Any, encoded: EncodedInput, description: str, *,
                head_mask: np.ndarray | None = None, tokenizer: Any = None, top_k: int = TOP_K) -> AttentionTrace:
    """Run ``model`` (of ``family``) once on ``encoded`` and keep its tensors as an ``AttentionTrace``.

    Args:
        family: the model's adapter.
        model: a loaded model (a transformers model from ``model_core.models.loading``, or the chapter-3 encoder).
        encoded: a text or pair for a batch of one (``Family.encode``).
        description: one line naming the model, for the pages.
        head_mask: (layer, head) bools; False switches a head off.
        tokenizer: the model's tokenizer (its special tokens; a decoder's predictions are decoded with it).
        top_k: how many next-token predictions a decoder keeps per position.
    """
    device = next(model.parameters()).device
    config = model.config
    n_layers, n_heads = family.n_layers(config), family.n_heads(config)
    check_full_size(n_layers, n_heads, encoded.input_ids.shape[1])
    gate = head_gate(head_mask, n_layers, n_heads, device)
    with GATE.turn():  # until the arrays are numpy: the pass's tensors are its memory
        ids, types = encoded.input_ids, encoded.token_type_ids
        if ids.device != device:  # host to device, only when the model is elsewhere
            ids, types = ids.to(device), types.to(device)
        out: ForwardOutput = family.forward(model, ids, types, None, head_mask=gate)
        return _trace_of(family, model, encoded, description, out, head_mask, tokenizer, top_k)


def _trace_of(family: Family, model: Any, encoded: EncodedInput, description: str, out: ForwardOutput,
              head_mask: np.ndarray | None, tokenizer: Any, top_k: int) -> AttentionTrace:
    """A pass's tensors as an ``AttentionTrace`` of numpy arrays: they stay on the model's device until the end,
    then come to the host together (``to_host``: one copy a dtype)."""
    config = model.config
    kv_host = np.asarray(family.kv_heads(config), dtype=np.int64)
    kv = torch.as_tensor(kv_host, device=out.weights[0].device)
    values = _per_query_head(out.values, kv)  # (layer, head, pos, d_head)
    norms = value_norms(values, family.output_weights(model))
    device = {
        "weights": torch.stack([w[0] for w in out.weights]),  # (layer, head, q_pos, k_pos)
        "mask": out.mask[0],
        "queries": torch.stack([q[0] for q in out.queries]),
        "keys": _per_query_head(out.keys, kv),
        "values": values,
        "value_norms": norms,
        "hidden_states": torch.stack([h[0] for h in out.hidden]),
    }
    if out.class_logits is not None:
        device["logits"] = out.class_logits[0]
    if family.is_decoder:
        device["next_token_ids"], device["next_token_probs"] = top_on_device(family, model, out.hidden[-1][0], top_k)
    host = dict(zip(device, to_host(list(device.values()))))
    predictions = {}
    if family.is_decoder:
        ids = host["next_token_ids"].astype(np.int64)
        predictions = dict(next_token_ids=ids, next_token_probs=host["next_token_probs"],
                           next_token_strings=decode_top(ids, tokenizer))
    return AttentionTrace(
        **_input_fields(encoded),
        weights=host["weights"],
        mask=host["mask"] > 0.5,
        queries=host["queries"],
        keys=host["keys"],
        values=host["values"],
        value_norms=host["value_norms"],
        hidden_states=host["hidden_states"],
        model_kind=family.name,
        causal=bool(getattr(config, "causal", False)) or family.is_decoder,
        description=description,
        logits=host.get("logits"),
        head_mask=None if head_mask is None else np.asarray(head_mask, dtype=bool),
        kv_heads=kv_host,
        score_scale=out.score_scale,
        score_softcap=out.score_softcap,
        special_tokens=family.special_tokens(tokenizer) if tokenizer is not None else frozenset(),
        dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
        **predictions,
    )


def trace_custom(model: Any, encoded: EncodedInput, description: str,
                 head_mask: np.ndarray | None = None) -> AttentionTrace:
    """``trace_model`` for the chapter-3 encoder."""
    return trace_model(family_of(model), model, encoded, description, head_mask=head_mask)


def trace_pretrained(loaded: LoadedModel, encoded: EncodedInput, head_mask: np.ndarray | None = None) -> AttentionTrace:
    """``trace_model`` for a pretrained model from ``model_core.models.loading`` (any family)."""
    return trace_model(loaded.family, loaded.model, encoded, loaded.description, head_mask=head_mask,
                       tokenizer=loaded.tokenizer)

