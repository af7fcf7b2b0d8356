"""Head roles in the app: the probes cached per model (all sessions share them), the sidebar text's role scores
cached per trace, and links that open a probe input in the heatmaps page."""

from __future__ import annotations

import dataclasses
from urllib.parse import urlencode

import numpy as np
import streamlit as st

from model_core import AttentionTrace, TraceRequest
from model_core.compact.trace import CompactTrace
from model_core.trace.request import MODEL_FIELDS
from model_core.roles import (
    TEXT_ROLES,
    RetrievalResult,
    RoleScores,
    retrieval_scores,
    role_scores,
    score_roles,
)
from model_core.roles.long_text import compact_role_scores
from ui.trace_cache import per_trace
from ui.waiting import queue_text, waiting_with
from ui.fields import request_params

ROLES_TTL_S = 6 * 3600


def model_key(request: TraceRequest) -> TraceRequest:
    """The request with its text and head mask dropped: what identifies the model whose heads are scored."""
    return dataclasses.replace(request, text_a="", text_b="", truncate=False, head_mask=None)


@st.cache_resource(max_entries=8, ttl=ROLES_TTL_S, show_spinner=False)
def probe_scores(model: TraceRequest, seed: int) -> RoleScores:
    """``model_core.roles.score_roles`` of a model, once per (model, seed) for every session."""
    from ui.loaders import CACHED_MODELS, device

    bar = st.progress(0.0, text="Scoring every head on the repeated random sequences…")
    with waiting_with(lambda place, running: bar.progress(0.0, text=queue_text(place, running))):
        scores = score_roles(model, seed, models=CACHED_MODELS, device=device())
    bar.empty()
    return scores


@st.cache_resource(max_entries=8, ttl=ROLES_TTL_S, show_spinner=False)
def retrieval(model: TraceRequest, seed: int) -> RetrievalResult:
    """``model_core.roles.retrieval_scores`` of a decoder, with a progress bar, once per (model, seed)."""
    from ui.loaders import CACHED_MODELS, device

    bar = st.progress(0.0, text="Decoding the needle-in-a-haystack prompts…")

    def step(done: int, total: int) -> None:
        bar.progress(done / total, text=f"Decoding the needle-in-a-haystack prompts… step {done} of {total}")

    with waiting_with(lambda place, running: bar.progress(0.0, text=queue_text(place, running))):
        result = retrieval_scores(model, seed, models=CACHED_MODELS, device=device(), on_step=step)
    bar.empty()
    return result


@per_trace()
def text_scores(trace: AttentionTrace) -> dict[str, np.ndarray]:
    """The roles that apply to any text (previous-token, duplicate-token, sink) on the sidebar's trace."""
    return role_scores(trace, TEXT_ROLES)


@per_trace()
def _long_text_scores(trace: CompactTrace, special: tuple[bool, ...]) -> dict[str, np.ndarray]:
    bar = st.progress(0.0, text="Scoring every head at the text's repeated words…")
    scores = compact_role_scores(trace, np.asarray(special, dtype=bool),
                                 progress=lambda done: bar.progress(done, text=f"Scoring every head at the text's "
                                                                          f"repeated words… {done:.0%}"))
    bar.empty()
    return scores


def long_text_scores(trace: CompactTrace, request: TraceRequest) -> dict[str, np.ndarray]:
    """The text roles and induction on a long input's compact trace (``roles.long_text``), cached per trace."""
    from model_core.analysis._common import is_special
    from ui.loaders import pretrained_for

    specials = frozenset(pretrained_for(request).tokenizer.all_special_tokens)
    special = tuple(is_special(t, specials) for t in trace.tokens)
    return _long_text_scores(trace, special)


def heatmaps_query(request: TraceRequest, text: str, layer: int, head: int) -> dict[str, str]:
    """The heatmaps page's query parameters (``ui.fields.QUERY_PARAMS``) for ``text`` on the request's model,
    with (layer, head) in focus."""
    # text_b empty, said explicitly: a link without it opens the sidebar's default sentence B.
    return {**request_params(request, MODEL_FIELDS), "text_a": text, "text_b": "", "layer": str(layer),
            "head": str(head)}


def heatmaps_url(request: TraceRequest, text: str, layer: int, head: int) -> str:
    """A link (relative to the app) that opens the heatmaps page on ``text`` with the head in focus."""
    return "heatmaps?" + urlencode(heatmaps_query(request, text, layer, head))
