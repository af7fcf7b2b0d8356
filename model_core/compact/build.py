"""Build a compact trace (``model_core.compact.trace``) of a long input: one sdpa forward pass that keeps queries and keys,
then each layer summarised in blocks of query rows."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from model_core.compact.trace import OVERVIEW_CELLS, CompactTrace, Progress
from model_core.compact.summary import LayerMask, summarise_layer
from model_core.compact.views import TraceForm, choose_form
from model_core.families.capture import recording
from model_core.trace.request import TraceRequest, _resolve
from model_core.settings import Settings

COMPACT_MAX_TOKENS = 4096
"""The default limit of a compact trace (a full trace stops at ``AE_MAX_TOKENS``, 512): SmolLM2 allows 8,192."""
PREDICTION_CHUNK = 256
"""Positions unembedded at once: 256 x a 49,152-token vocabulary is 50 MB, not 800 MB for 4,096 positions."""


def _allowed(mask: torch.Tensor | None, n: int, causal: bool) -> torch.Tensor:
    """The mask a layer received as booleans (True = may attend); None means plain causal (or none).

    Shape: mask (1, 1, q_pos, k_pos) additive or bool -> (q_pos, k_pos) bool.
    """
    if mask is None:
        full = torch.ones(n, n, dtype=torch.bool)
        return full.tril() if causal else full
    m = mask[0, 0].cpu()
    return m if m.dtype == torch.bool else m > torch.finfo(m.dtype).min / 2


def _top_predictions(model: Any, last_hidden: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
    """A decoder's top-k next tokens at every position, unembedded in chunks. Shape: (pos, hidden) -> (pos, k) x 2."""
    head = model.get_output_embeddings()
    cap = getattr(model.config, "final_logit_softcapping", None)
    ids, probs = [], []
    for r0 in range(0, len(last_hidden), PREDICTION_CHUNK):
        logits = head(last_hidden[r0:r0 + PREDICTION_CHUNK]).float()
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        top = torch.softmax(logits, dim=-1).topk(k, dim=-1)
        ids.append(top.indices.cpu().numpy().astype(np.int64))
        probs.append(top.values.cpu().numpy())
    return np.concatenate(ids), np.concatenate(probs)


@torch.inference_mode()
def build_compact(request: TraceRequest, *, device: str | torch.device | None = None,
                  settings: Settings | None = None, models: Any = None, max_tokens: int = COMPACT_MAX_TOKENS,
                  top_k: int = 10, progress: Progress | None = None, predictions: bool = True,
                  largest_weight: bool = True) -> CompactTrace:
    """Run the request's pretrained model once with sdpa and summarise every layer into a ``CompactTrace``.

    Args:
        request: a pretrained model (any transformers family) and its text; no head mask.
        max_tokens: the longest input accepted (and the model's positions).
        progress: called with ("forward" | "summary", fraction done).
        predictions: keep a decoder's top ``top_k`` next tokens at every position (about 2 s at 4,096 tokens on
            a 2-core CPU: the unembedding is 49,152 x 576 per position for SmolLM2).
        largest_weight: compute the ``max_weight`` statistic (a second pass over every layer; the app computes it
            later, when a page shows it: ``compact_summary.largest_weights``).

    Raises:
        InputError: the text cannot be traced (empty, or over the limit: the message names it).
        ModelLoadError: the model cannot be loaded.
        ValueError: the custom encoder or a head mask was asked for.
    """
    if request.model != "pretrained":
        raise ValueError("A compact trace is made for pretrained models (any supported family); the chapter-3 "
                         "encoder is traced in full (export without --compact).")
    if request.head_mask is not None:
        raise ValueError("A compact trace keeps every head on; trace the full form for head masking.")
    dev, settings, models = _resolve(device, settings, models)
    loaded = models.pretrained(request.model_id or settings.default_model, dev)
    family, model, config = loaded.family, loaded.model, loaded.model.config
    if max_tokens <= loaded.max_positions:
        limit = {"max_tokens": max_tokens,
                 "limit_hint": f" (max_tokens, --max-tokens on the command line; this model's positions allow "
                               f"{loaded.max_positions})"}
    else:
        limit = {"max_tokens": loaded.max_positions, "limit_hint": " (the model's position table)"}
    encoded = family.encode(loaded.tokenizer, request.text_a, request.text_b, truncate=request.truncate, **limit)
    n_layers = family.n_layers(config)
    report = progress or (lambda phase, done: None)
    report("forward", 0.0)
    net = family.base(model)
    with recording(vectors=True, hidden=False, compact=True,
                   on_layer=lambda layer: report("forward", (layer + 1) / n_layers)) as rec:
        extra = {"token_type_ids": encoded.token_type_ids.to(dev)} if family.uses_token_types else {"use_cache": False}
        out = net(input_ids=encoded.input_ids.to(dev), **extra)
    predictions = (_top_predictions(model, out.last_hidden_state[0], top_k) if family.is_decoder and predictions
                   else (None, None))
    del out
    n = encoded.input_ids.shape[1]
    kv = torch.as_tensor(family.kv_heads(config))
    pool = math.ceil(n / OVERVIEW_CELLS)
    mask_ids: dict[int, int] = {}
    masks: list[LayerMask] = []
    mask_of_layer = np.empty(n_layers, dtype=np.int64)
    queries = keys = None
    lse = overview = None
    stats: dict[str, np.ndarray] = {}
    for layer in range(n_layers):
        raw = rec.masks.pop(layer)
        key = 0 if raw is None else raw.data_ptr()  # layers of one kind share one mask tensor
        if key not in mask_ids:
            mask_ids[key] = len(masks)
            masks.append(LayerMask.of(_allowed(raw, n, family.is_decoder)))
        mask_of_layer[layer] = mask_ids[key]
        q = rec.queries.pop(layer)[0].float().cpu()  # (head, pos, d_head)
        k = rec.keys.pop(layer)[0].float().cpu()  # (kv_head, pos, d_head)
        summary = summarise_layer(q, k.index_select(0, kv), masks[mask_of_layer[layer]], rec.scaling[layer],
                                  rec.softcap.get(layer), pool, largest=largest_weight)
        if queries is None:  # filled layer by layer, so the recorded tensors are freed as we go
            queries = np.empty((n_layers, *q.shape), dtype=np.float32)
            keys = np.empty((n_layers, *k.shape), dtype=np.float32)
            lse = np.empty((n_layers, *summary.lse.shape), dtype=np.float64)
            overview = np.empty((n_layers, *summary.overview.shape), dtype=np.float32)
        queries[layer], keys[layer] = q.numpy(), k.numpy()
        lse[layer], overview[layer] = summary.lse.numpy(), summary.overview.numpy()
        for name, value in summary.stats.items():
            stats.setdefault(name, np.empty((n_layers, len(value))))[layer] = value.numpy()
        report("summary", (layer + 1) / n_layers)
    return CompactTrace(
        tokens=encoded.tokens, token_ids=encoded.input_ids[0].numpy().astype(np.int64),
        queries=queries, keys=keys, kv_heads=kv.numpy().astype(np.int64), lse=lse,
        masks=torch.stack([m.allowed for m in masks]).numpy(), mask_of_layer=mask_of_layer, overview=overview, stats=stats,
        pool=pool, model_kind=family.name, description=loaded.description, causal=family.is_decoder,
        score_scale=rec.scaling[0], score_softcap=rec.softcap.get(0),
        next_token_ids=predictions[0], next_token_probs=predictions[1],
    )


def trace_form(request: TraceRequest, *, device: str | torch.device | None = None, settings: Settings | None = None,
               models: Any = None) -> TraceForm:
    """Whether ``build_trace`` (full) or ``build_compact`` serves the request: the full form where its weights fit
    AE_FULL_TRACE_MB; a transformers model's longer input in compact form. Tokenises the text (the model is loaded
    once, as the trace will need it).

    Raises:
        InputError: the text cannot be traced (empty, or over AE_MAX_TOKENS or the model's positions).
        ModelLoadError: the model cannot be loaded.
    """
    from model_core.trace.request import token_limit

    dev, settings, models = _resolve(device, settings, models)
    if request.model != "pretrained" or request.head_mask is not None:
        return TraceForm(False, 0, 0, "full: the chapter-3 encoder and head masking are always traced in full")
    loaded = models.pretrained(request.model_id or settings.default_model, dev)
    encoded = loaded.family.encode(loaded.tokenizer, request.text_a, request.text_b, truncate=request.truncate,
                                   **token_limit(settings, loaded.max_positions))
    config = loaded.model.config
    return choose_form(loaded.family.n_layers(config), loaded.family.n_heads(config), len(encoded.tokens),
                       settings.full_trace_mb, can_compact=True)
