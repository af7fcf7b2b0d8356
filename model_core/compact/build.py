"""Build a compact trace (``model_core.compact.trace``) of a long input: one pass through the route
(``Family.forward(compact=True)``: sdpa, keeping queries and keys but no weights), then each layer summarised in
blocks of query rows, all under one turn of the route's gate."""

from __future__ import annotations

import math

import numpy as np
import torch

from model_core.compact.summary import summarise_layer
from model_core.compact.trace import OVERVIEW_CELLS, CompactTrace, LayerMask, Progress
from model_core.compact.views import TraceForm, choose_form
from model_core.settings import Settings
from model_core.trace.forward import top_predictions
from model_core.trace.gate import GATE
from model_core.trace.request import TraceRequest
from model_core.trace.encoding import EncodedInput
from model_core.trace.resolve import Models, Resolved, resolve

COMPACT_MAX_TOKENS = 4096
"""The default limit of a compact trace on the command line (the app passes ``AE_MAX_TOKENS``, 4,096 by default;
a full trace is limited by the size of its weights, ``AE_FULL_TRACE_MB``): SmolLM2's positions allow 8,192."""


def _allowed(mask: torch.Tensor | None, n: int, causal: bool) -> torch.Tensor:
    """The mask a layer received as booleans (True = may attend); None means plain causal (or none).

    Shape: mask (1, 1, q_pos, k_pos) additive or bool -> (q_pos, k_pos) bool.
    """
    if mask is None:
        full = torch.ones(n, n, dtype=torch.bool)
        return full.tril() if causal else full
    m = mask[0, 0].cpu()
    return m if m.dtype == torch.bool else m > torch.finfo(m.dtype).min / 2


@torch.inference_mode()
def build_compact(request: TraceRequest, *, device: str | torch.device | None = None,
                  settings: Settings | None = None, models: Models | None = None, max_tokens: int = COMPACT_MAX_TOKENS,
                  top_k: int = 10, progress: Progress | None = None, predictions: bool = True,
                  largest_weight: bool = True) -> CompactTrace:
    """Run the request's pretrained model once with sdpa and summarise every layer into a ``CompactTrace``.

    Args:
        request: a pretrained model (any transformers family) and its text; no head mask.
        max_tokens: the longest input accepted (within the model's positions).
        progress: called with ("forward" | "summary", fraction done).
        predictions: keep a decoder's top ``top_k`` next tokens at every position (about 2 s at 4,096 tokens on
            a 2-core CPU: the unembedding is 49,152 x 576 per position for SmolLM2).
        largest_weight: compute the ``max_weight`` statistic (a second pass over every layer; the app computes it
            later, when a page shows it: ``model_core.compact.summary.largest_weights``).

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
    resolved = resolve(request, device=device, settings=settings, models=models)
    encoded = resolved.encode(request, max_tokens=max_tokens)
    report = progress or (lambda phase, done: None)
    report("forward", 0.0)
    with GATE.turn():  # the pass and its summary: the recorded queries and keys are freed layer by layer
        return _summarise(resolved, encoded, report, top_k if predictions else 0, largest_weight)


def _summarise(resolved: Resolved, encoded: EncodedInput, report: Progress, top_k: int,
               largest_weight: bool) -> CompactTrace:
    """Run the compact pass and summarise each layer into a ``CompactTrace``."""
    family, model, dev = resolved.family, resolved.model, resolved.device
    n_layers = family.n_layers(model.config)
    want_predictions = family.is_decoder and top_k > 0
    out = family.forward(model, encoded.input_ids.to(dev), encoded.token_type_ids.to(dev), None, compact=True,
                         hidden="last" if want_predictions else False,
                         on_layer=lambda layer: report("forward", (layer + 1) / n_layers))
    predictions = (top_predictions(family, model, out.hidden[-1][0], top_k)[:2] if want_predictions
                   else (None, None))
    n = encoded.input_ids.shape[1]
    kv = torch.as_tensor(family.kv_heads(model.config))
    pool = math.ceil(n / OVERVIEW_CELLS)
    mask_ids: dict[int, int] = {}
    masks: list[LayerMask] = []
    mask_of_layer = np.empty(n_layers, dtype=np.int64)
    queries = keys = None
    lse = overview = None
    stats: dict[str, np.ndarray] = {}
    for layer in range(n_layers):
        raw, out.layer_masks[layer] = out.layer_masks[layer], None  # freed as we go
        key = 0 if raw is None else raw.data_ptr()  # layers of one kind share one mask tensor
        if key not in mask_ids:
            mask_ids[key] = len(masks)
            masks.append(LayerMask.of(_allowed(raw, n, family.is_decoder)))
        mask_of_layer[layer] = mask_ids[key]
        q = out.queries[layer][0].float().cpu()  # (head, pos, d_head)
        k = out.keys[layer][0].float().cpu()  # (kv_head, pos, d_head)
        out.queries[layer] = out.keys[layer] = None
        summary = summarise_layer(q, k.index_select(0, kv), masks[mask_of_layer[layer]], out.layer_scales[layer],
                                  out.layer_softcaps[layer], pool, largest=largest_weight)
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
        pool=pool, model_kind=family.name, description=resolved.description, causal=family.is_decoder,
        score_scale=out.layer_scales[0], score_softcap=out.layer_softcaps[0],
        next_token_ids=predictions[0], next_token_probs=predictions[1],
    )


def trace_form(request: TraceRequest, *, device: str | torch.device | None = None, settings: Settings | None = None,
               models: Models | None = None) -> TraceForm:
    """Whether ``build_trace`` (full) or ``build_compact`` serves the request: the full form where its weights fit
    AE_FULL_TRACE_MB; a transformers model's longer input in compact form. Loads the model and tokenises the text
    as the build will (``resolve``), which then finds both done: the encoding is kept (``Resolved.encode``).

    Raises:
        InputError: the text cannot be traced (empty, or over AE_MAX_TOKENS or the model's positions).
        ModelLoadError: the model cannot be loaded.
    """
    if request.model != "pretrained" or request.head_mask is not None:
        return TraceForm(False, 0, 0, "full: the chapter-3 encoder and head masking are always traced in full")
    resolved = resolve(request, device=device, settings=settings, models=models)
    n_tokens = len(resolved.encode(request).tokens)  # kept: the build that follows reads the same encoding
    config = resolved.model.config
    return choose_form(resolved.family.n_layers(config), resolved.family.n_heads(config), n_tokens,
                       resolved.settings.full_trace_mb, can_compact=True)
