"""Build a compact trace (``model_core.compact.trace``) of a long input: one pass through the route
(``Family.forward(compact=True)``: sdpa, keeping queries and keys but no weights), then each layer summarised in
blocks of query rows, all under one turn of the route's gate."""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from model_core.compact.summary import summarise_layer
from model_core.compact.trace import OVERVIEW_CELLS, QUERY_BLOCK, CompactTrace, LayerMask, Progress
from model_core.compact.views import TraceForm, choose_form
from model_core.families.capture import current_recorder
from model_core.kernel import allowed_from_mask, float64_device, on_device
from model_core.models.memory import release_freed_memory
from model_core.models.run_memory import check_run_memory, compact_trace_bytes, model_shape, run_memory_limit_mb
from model_core.settings import Settings
from model_core.trace.forward import to_host, top_predictions
from model_core.trace.sequence import with_reply
from model_core.gate import GATE
from model_core.trace.request import TraceRequest
from model_core.families.encoding import EncodedInput
from model_core.trace.resolve import Models, Resolved, resolve

COMPACT_MAX_TOKENS = 4096
"""The command line's limit of a compact trace before ``AE_MAX_TOKENS`` set it (4,096, that setting's default; a
full trace is limited by the size of its weights, ``AE_FULL_TRACE_MB``): SmolLM2's positions allow 8,192."""


def _layer_mask(raw: torch.Tensor | None, n: int, causal: bool) -> LayerMask:
    """``LayerMask.of`` the mask a layer received, worked out in blocks of query rows: the (q_pos, k_pos) booleans
    are the one n x n tensor made (``LayerMask.of``'s checks make four more, 268 MB at 8,192 tokens). None means
    plain causal (or, in an encoder, all open).

    Shape: raw (1, 1, q_pos, k_pos) additive or bool, or None.
    """
    allowed = torch.empty(n, n, dtype=torch.bool)
    choosing = torch.empty(n, dtype=torch.bool)
    future, plain = False, True
    cols = torch.arange(n)
    for r0 in range(0, n, QUERY_BLOCK):
        r1 = min(r0 + QUERY_BLOCK, n)
        below = cols[None, :] <= torch.arange(r0, r1)[:, None]  # the plain causal mask's rows
        if raw is None:
            block = below if causal else torch.ones(r1 - r0, n, dtype=torch.bool)
        else:
            block = allowed_from_mask(raw[0, 0, r0:r1].cpu())
        allowed[r0:r1] = block
        future = future or bool((block & ~below).any())
        plain = plain and bool(torch.equal(block, below))
        choosing[r0:r1] = block.sum(1) > 1  # a causal model's first query has no choice
    if not choosing.any():
        choosing[:] = True
    return LayerMask(allowed, future, not future and plain, choosing)


@torch.inference_mode()
def build_compact(request: TraceRequest, *, device: str | torch.device | None = None,
                  settings: Settings | None = None, models: Models | None = None, max_tokens: int | None = None,
                  top_k: int = 10, progress: Progress | None = None, predictions: bool = True,
                  largest_weight: bool = True) -> CompactTrace:
    """Run the request's pretrained model once with sdpa and summarise every layer into a ``CompactTrace``.

    Args:
        request: a pretrained model (any transformers family) and its text; no head mask.
        max_tokens: the longest input accepted (within the model's positions); None means ``AE_MAX_TOKENS``.
        progress: called with ("forward" | "summary", fraction done).
        predictions: keep a decoder's top ``top_k`` next tokens at every position (about 2 s at 4,096 tokens on
            a 2-core CPU: the unembedding is 49,152 x 576 per position for SmolLM2).
        largest_weight: compute the ``max_weight`` statistic (on the CPU a second pass over every layer; the app
            computes it later, when a page shows it: ``model_core.compact.summary.largest_weights``). On an
            accelerator the streamed summary has it for free, and keeps it either way.

    Raises:
        InputError: the text cannot be traced (empty, or over the limit: the message names it).
        ModelLoadError: the model cannot be loaded.
        RunMemoryError: its estimate (``run_memory.compact_trace_bytes``) is over the run memory limit.
        ValueError: the custom encoder or a head mask was asked for.
    """
    if request.model != "pretrained":
        raise ValueError("A compact trace is made for pretrained models (any supported family); the chapter-3 "
                         "encoder is traced in full (export without --compact).")
    if request.head_mask is not None:
        raise ValueError("A compact trace keeps every head on; trace the full form for head masking.")
    resolved = resolve(request, device=device, settings=settings, models=models)
    encoded = resolved.encode(request, max_tokens=max_tokens)
    _check_memory(resolved, len(encoded.tokens))
    report = progress or (lambda phase, done: None)
    report("forward", 0.0)
    with GATE.turn():  # the pass and its summary: the recorded queries and keys are freed layer by layer
        compact = _summarise(resolved, encoded, report, top_k if predictions else 0, largest_weight)
    return with_reply(compact, request, encoded)  # a generated sequence's reply starts where its request says


def _check_memory(resolved: Resolved, n: int) -> None:
    """Refuse a compact trace whose estimate (``run_memory.compact_trace_bytes``) is over the limit: the host's (its
    arrays, on any device) and, where the summary runs on a GPU, the GPU's too.

    Raises:
        RunMemoryError: with the estimate, the limit and what to change.
    """
    config = resolved.model.config
    config = getattr(config, "text_config", None) or config
    estimate = functools.partial(compact_trace_bytes, model_shape(resolved.model), n,
                                 softcap=bool(getattr(config, "attn_logit_softcapping", None)),
                                 masks=2 if getattr(config, "sliding_window", None) else 1)
    what = f"A compact trace of {n:,} tokens"
    advice = "A shorter text fits (AE_MAX_TOKENS sets the longest a user may trace)."
    if float64_device(resolved.device).type != "cpu":
        check_run_memory(what, estimate(on_device=True), run_memory_limit_mb(resolved.settings,
                                                                             device=resolved.device), advice)
    check_run_memory(what, estimate(), run_memory_limit_mb(resolved.settings), advice)


class _LayerCopies:
    """The ``on_layer`` of a compact pass: each layer's recorded queries and keys, copied into the trace's arrays as
    soon as the layer has run, and the recorder's own tensors swapped for views of those arrays.

    The pass then never holds two copies (the recorded tensors were freed only in the summary, after the whole
    pass), and a query that is a view of a fused projection's output does not keep that output alive. Each layer's
    freed blocks are given back at once (``malloc_trim``): glibc otherwise keeps the heap they fragment resident.

    With ``keep`` (a model on an accelerator, where the summary runs), each layer's queries and keys also stay
    there, in the model's dtype, as copies of their own (``held``): the summary reads them there, not the
    host's arrays.
    """

    def __init__(self, n_layers: int, report: Progress, keep: bool = False, trim: bool = True):
        self.n_layers, self.report, self.keep, self.trim = n_layers, report, keep, trim
        self.queries: np.ndarray | None = None  # (layer, head, pos, d_head)
        self.keys: np.ndarray | None = None  # (layer, kv_head, pos, d_head)
        self.held: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # layer -> q, k (head or kv_head, pos, d)

    def __call__(self, layer: int) -> None:
        rec = current_recorder()
        q, k = rec.queries[layer][0], rec.keys[layer][0]  # (head, pos, d_head), (kv_head, pos, d_head)
        if self.queries is None:
            self.queries = np.empty((self.n_layers, *q.shape), dtype=np.float32)
            self.keys = np.empty((self.n_layers, *k.shape), dtype=np.float32)
        if self.keep:  # clones: a view of a fused projection's output would keep all of it
            self.held[layer] = q.clone(), k.clone()
        self.queries[layer], self.keys[layer] = to_host([q, k])
        rec.queries[layer] = torch.from_numpy(self.queries[layer])[None]
        rec.keys[layer] = torch.from_numpy(self.keys[layer])[None]
        if self.trim:  # the recorded tensors' host blocks, or glibc keeps the heap they fragment resident
            release_freed_memory()
        self.report("forward", (layer + 1) / self.n_layers)


def layer_masks_of(raw_masks: list, n: int, causal: bool) -> tuple[list[LayerMask], np.ndarray]:
    """Each distinct mask of the pass as a ``LayerMask`` (layers of one kind share one tensor), and which one each
    layer used. Worked out before the summary, so the pass's own n x n masks (an additive float mask is 268 MB at
    8,192 tokens) are freed before it starts.

    Shape: raw_masks[layer] (1, 1, q_pos, k_pos) additive or bool, or None -> mask_of_layer (layer,) int64.
    """
    mask_ids: dict[int, int] = {}
    masks: list[LayerMask] = []
    mask_of_layer = np.empty(len(raw_masks), dtype=np.int64)
    for layer in range(len(raw_masks)):
        raw, raw_masks[layer] = raw_masks[layer], None  # the pass's reference goes with the last layer using it
        key = 0 if raw is None else raw.data_ptr()
        if key not in mask_ids:
            mask_ids[key] = len(masks)
            masks.append(_layer_mask(raw, n, causal))
        mask_of_layer[layer] = mask_ids[key]
        del raw
    return masks, mask_of_layer


def _summarise(resolved: Resolved, encoded: EncodedInput, report: Progress, top_k: int,
               largest_weight: bool) -> CompactTrace:
    """Run the compact pass and summarise each layer into a ``CompactTrace``."""
    family, model, dev = resolved.family, resolved.model, resolved.device
    n_layers = family.n_layers(model.config)
    want_predictions = family.is_decoder and top_k > 0
    at = float64_device(dev)  # where the summary runs: the model's device (an accelerator's, when it has float64)
    # Where the summary runs on the device, the pass's and the summary's blocks are the device's: a trim would only
    # walk the host's heap (9 ms a call on 2 cores, twice a layer)
    on_host = at.type == "cpu"
    copies = _LayerCopies(n_layers, report, keep=not on_host, trim=on_host)
    out = family.forward(model, encoded.input_ids.to(dev), encoded.token_type_ids.to(dev), None, compact=True,
                         hidden="last" if want_predictions else False, on_layer=copies)
    n = encoded.input_ids.shape[1]
    masks, mask_of_layer = layer_masks_of(out.layer_masks, n, family.is_decoder)  # the pass's masks freed first
    predictions = (top_predictions(family, model, out.hidden[-1][0], top_k)[:2] if want_predictions
                   else (None, None))
    kv = torch.as_tensor(family.kv_heads(model.config))
    pool = math.ceil(n / OVERVIEW_CELLS)
    queries, keys = copies.queries, copies.keys
    lse = overview = None
    stats: dict[str, np.ndarray] = {}
    masks_at = {}  # mask index -> that mask on the summary's device
    kv_at = on_device(kv, at)
    for layer in range(n_layers):
        out.queries[layer] = out.keys[layer] = None  # views of ``queries`` and ``keys``
        if on_host:
            q, k = torch.from_numpy(queries[layer]), torch.from_numpy(keys[layer])  # (head or kv_head, pos, d)
        else:
            q, k = (t.float() for t in copies.held.pop(layer))
        k = k.index_select(0, kv_at)  # each query head's key: (head, pos, d_head)
        which = int(mask_of_layer[layer])
        if which not in masks_at:
            masks_at[which] = masks[which] if on_host else masks[which].to(at)
        summary = summarise_layer(q, k, masks_at[which], out.layer_scales[layer], out.layer_softcaps[layer], pool,
                                  largest=largest_weight or not on_host)  # free in the streamed blocks
        names = list(summary.stats)
        parts = to_host([summary.lse, summary.overview, *summary.stats.values()], pack=True)  # one copy a layer
        del q, k, summary
        if lse is None:
            lse = np.empty((n_layers, *parts[0].shape), dtype=np.float64)
            overview = np.empty((n_layers, *parts[1].shape), dtype=np.float32)
        lse[layer], overview[layer] = parts[0], parts[1]
        for name, value in zip(names, parts[2:]):
            stats.setdefault(name, np.empty((n_layers, len(value))))[layer] = value
        if on_host:
            release_freed_memory()
        report("summary", (layer + 1) / n_layers)
    allowed = [m.allowed.numpy() for m in masks]
    return CompactTrace(
        tokens=encoded.tokens, token_ids=encoded.input_ids[0].numpy().astype(np.int64),
        queries=queries, keys=keys, kv_heads=kv.numpy().astype(np.int64), lse=lse,
        masks=allowed[0][None] if len(allowed) == 1 else np.stack(allowed), mask_of_layer=mask_of_layer,
        overview=overview, stats=stats, pool=pool, model_kind=family.name, description=resolved.description,
        causal=family.is_decoder, score_scale=out.layer_scales[0], score_softcap=out.layer_softcaps[0],
        next_token_ids=predictions[0], next_token_probs=predictions[1],
        dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
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
