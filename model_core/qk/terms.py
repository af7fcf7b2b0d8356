"""Why a head attends where it does: an attention score split into query-side x key-side components.

For head h of layer l, query i and key j, the residual stream entering layer l is the sum of its parts: the token
embedding (``embed``), the position (and segment) embedding (``pos``) where positions are absolute, every earlier
head's write, every earlier MLP's output, and the constant biases (``bias``). With every norm frozen at its actual
statistics (the norm before attention at the whole residual's scale; post-LN BERT's and the chapter-3 encoder's
LayerNorms, Gemma's post-attention norm, Qwen3/Gemma 3's per-head query and key norms each at its own input), the
query and the key are linear in the parts: ``q_i = Σ_c q_i^c`` and ``k_j = Σ_d k_j^d``, the rotary embedding at each
position included. ``terms[c][d] = q_i^c · k_j^d × scale`` then sums to the score s_ij before the mask and the
softmax, exactly (Kamath et al., 2025, "QK attributions"). Gemma 2's softcap is not linear: the split is of the score
before the cap.

Every tensor is read through the hook points (``model_core.families.hooked.run_with_hooks``) in one pass, and only
at the positions asked for: nothing of size layer x head x n² x d is held. The parts of a pre-norm model are projected
on the key side as they arrive, so the row view at thousands of tokens holds (component, key, d_head) numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from model_core.families import family_of
from model_core.families.weights import layer_weights
from model_core.models.run_memory import (
    check_run_memory,
    device_of,
    model_shape,
    qk_bytes,
    run_memory_limit_mb,
)
from model_core.qk.gather import COMPACT_FROM, PartsPass  # noqa: F401 (COMPACT_FROM: for callers)
from model_core.trace.resolve import resolve


@dataclass(frozen=True, eq=False)
class QKVersus:
    """The same split for a second key: why key j rather than key j'."""

    key: int
    score: float
    weight: float
    terms: np.ndarray  # (C, C): query component x key component, for s_ij'

    @property
    def log_odds(self) -> float:
        """log(a_ij / a_ij') = s_ij − s_ij' (for capped scores, of the capped ones)."""
        return self._log_odds

    _log_odds: float = 0.0


@dataclass(frozen=True, eq=False)
class QKTerms:
    """One head's score at (query, key) split into query component x key component.

    Shape: terms (C, C), rows the query's components, columns the key's; row (C, keys): each component's key-side
    share of the score at every key the query sees (the row view), or None.
    """

    tokens: list[str]
    layer: int
    head: int
    query: int
    key: int
    score: float
    weight: float
    components: list[str]
    terms: np.ndarray
    versus: QKVersus | None = None
    softcap: float | None = None
    row: np.ndarray | None = None
    row_keys: list[int] = field(default_factory=list)
    capped_score: float | None = None

    @property
    def query_side(self) -> np.ndarray:
        """Each query component's share of the score (terms summed over the key's components). Shape: (C,)."""
        return self.terms.sum(axis=1)

    @property
    def key_side(self) -> np.ndarray:
        """Each key component's share of the score (terms summed over the query's components). Shape: (C,)."""
        return self.terms.sum(axis=0)

    def top_pairs(self, n: int = 5, terms: np.ndarray | None = None) -> list[tuple[str, str, float]]:
        """The n (query component, key component, term) with the largest |term|."""
        t = self.terms if terms is None else terms
        flat = np.argsort(-np.abs(t), axis=None)[:n]
        return [(self.components[int(i) // t.shape[1]], self.components[int(i) % t.shape[1]],
                 float(t.flat[int(i)])) for i in flat]

    def to_json(self) -> dict[str, Any]:
        """The ``qk`` verb's JSON, exactly the issue's keys: tokens, layer, head, query, key, score, weight,
        components, terms, versus (null where the query sees one key). A softcapped model's split is of the score
        before the cap; the verb says so on stderr."""
        out: dict[str, Any] = {"tokens": self.tokens, "layer": self.layer, "head": self.head, "query": self.query,
                               "key": self.key, "score": self.score, "weight": self.weight,
                               "components": self.components, "terms": self.terms.tolist(), "versus": None}
        if self.versus is not None:  # None only where the query sees one key
            v = self.versus
            out["versus"] = {"key": v.key, "score": v.score, "weight": v.weight, "log_odds": v.log_odds,
                             "terms": v.terms.tolist()}
        return out


def component_names(model: Any, layer: int) -> list[str]:
    """The components of layer ``layer``'s input, in the ``qk`` verb's order: ``embed``, ``pos`` (absolute
    positions), each earlier layer's heads then its MLP, and ``bias`` where the model has a constant term."""
    family = family_of(model)
    names = ["embed"] + (["pos"] if family.embed_parts(model).pos_embed is not None else [])
    for l in range(layer):
        names += [f"L{l}H{h}" for h in range(family.n_heads(model.config))] + [f"L{l}MLP"]
    return names + (["bias"] if _has_bias(model, layer) else [])


def _has_bias(model: Any, layer: int) -> bool:
    """Whether any constant reaches layer ``layer``'s query or key: b_Q, b_K, a norm's β, an earlier b_O."""
    weights = layer_weights(model)
    lw = weights[layer]
    if lw.b_Q is not None or lw.b_K is not None or lw.ln1_b is not None:
        return True
    family = family_of(model)
    if any(w.b_O is not None for w in weights[:layer]):
        return True
    embed = family.embed_parts(model)
    parts = [family.parts(model, l) for l in range(layer)]
    lns = [embed.norm] + [p.post_ln1 for p in parts] + [p.post_ln2 for p in parts]
    return any(ln is not None and getattr(ln, "bias", None) is not None for ln in lns)


def qk_pass(model: Any, input_ids: torch.Tensor, layer: int, head: int, *,
            token_type_ids: torch.Tensor | None = None) -> PartsPass:
    """The one hooked pass behind every split of head ``head`` of layer ``layer`` on this text: each component's
    share of the head's query and key at every position. Keep it to split many (query, key) pairs at once.

    Raises:
        ValueError: a head or layer that does not exist; the message names the valid range.
    """
    family = family_of(model)
    _check_head(family, model.config, layer, head)
    check_qk_memory(model, layer, int(input_ids.shape[-1]))
    lw = layer_weights(model)[layer]
    return PartsPass(model, family, lw, layer, head, input_ids, token_type_ids)


def check_qk_memory(model: Any, layer: int, n_tokens: int) -> None:
    """Refuse a split whose pass and parts (``run_memory.qk_bytes``) would pass ``AE_RUN_MEMORY_MB``.

    Raises:
        RunMemoryError (a ValueError): the estimate and the limit.
    """
    n_components = len(component_names(model, layer))
    check_run_memory(f"Why this key on layer {layer} at {n_tokens:,} tokens ({n_components} components of the "
                     "query and the key at every position)", qk_bytes(model_shape(model), n_tokens, n_components),
                     run_memory_limit_mb(device=device_of(model)),
                     "Shorten the text, or pick an earlier layer (fewer components).")


def qk_pass_for_trace(model: Any, trace: Any, layer: int, head: int) -> PartsPass:
    """``qk_pass`` on a trace's tokens; from a full trace of a decoder (its pattern, values and residual stream) the
    parts are built without a model run (``PartsPass.from_trace``), elsewhere by the head's hooked pass.

    Raises:
        ValueError: a head or layer that does not exist; the message names the valid range.
    """
    family = family_of(model)
    _check_head(family, model.config, layer, head)
    fast = PartsPass.from_trace(model, family, layer_weights(model)[layer], layer, head, trace)
    if fast is not None:
        return fast
    ids = torch.tensor(np.array(trace.token_ids), dtype=torch.long)[None]  # a copy: the trace's arrays are read-only
    types = getattr(trace, "token_type_ids", None)
    types = None if types is None else torch.tensor(np.array(types), dtype=torch.long)[None]
    return qk_pass(model, ids, layer, head, token_type_ids=types)


def _check_head(family: Any, cfg: Any, layer: int, head: int) -> None:
    n_layers, n_heads = family.n_layers(cfg), family.n_heads(cfg)
    if not 0 <= layer < n_layers:
        raise ValueError(f"Layer {layer} does not exist: this model has layers 0..{n_layers - 1}.")
    if not 0 <= head < n_heads:
        raise ValueError(f"Head {head} does not exist: each layer has heads 0..{n_heads - 1}.")


def qk_terms(model: Any, tokenizer: Any, input_ids: torch.Tensor, layer: int, head: int, query: int,
             key: int | None = None, versus: int | None = None, *, row: bool = False,
             token_type_ids: torch.Tensor | None = None) -> QKTerms:
    """Split head ``head`` of layer ``layer``'s score at (query, key) into query x key components.

    Args:
        input_ids: (1, pos), the text as the model reads it. Negative positions count from the end.
        key: default: the key the query attends to most; ``versus``: a second key (default: the runner-up).
        row: also each component's key-side share at every key the query sees (the row view).

    Raises:
        ValueError: a position out of range, a key the query cannot see, a head or layer that does not exist; the
            message names the valid range.
    """
    check_position(query, int(input_ids.shape[1]), "query")  # before the pass: a bad position costs nothing
    pass_ = qk_pass(model, input_ids, layer, head, token_type_ids=token_type_ids)
    tokens = tokenizer.convert_ids_to_tokens(input_ids[0].tolist()) if tokenizer is not None else \
        [str(t) for t in input_ids[0].tolist()]
    return split_at(pass_, list(tokens), query, key, versus, row=row)


def split_at(pass_: PartsPass, tokens: list[str], query: int, key: int | None = None, versus: int | None = None, *,
             row: bool = False) -> QKTerms:
    """The split at one (query, key) from a pass (``qk_pass``): no model run.

    Raises:
        ValueError: a position out of range or a key the query cannot see; the message names the valid range.
    """
    n = pass_.n
    pass_.query = query = check_position(query, n, "query")
    weights_row = pass_.weights_row()  # (n,) the query's softmax over every key, 0 where it cannot see
    visible = [j for j in range(n) if pass_.visible(j)]
    if key is None:
        key = int(np.argmax(weights_row))
    key = check_position(key, n, "key")
    if not pass_.visible(key):
        raise ValueError(f"Query {query} cannot see key {key}: a decoder's query sees keys 0..{query} (the causal "
                         "mask); pick a key in that range.")
    if versus is None and len(visible) > 1:
        order = [j for j in np.argsort(-weights_row, kind="stable") if int(j) != key and pass_.visible(int(j))]
        versus = int(order[0]) if order else None
    elif versus is not None:
        versus = check_position(versus, n, "versus key")
        if not pass_.visible(versus):
            raise ValueError(f"Query {query} cannot see key {versus}: pick a key in 0..{query}.")
    terms = pass_.terms(key)
    score = pass_.score(key)
    comp = component_names(pass_.model, pass_.layer)
    assert terms.shape == (len(comp), len(comp)), (terms.shape, len(comp))
    vs = None
    if versus is not None:
        v_score = pass_.score(versus)
        log_odds = (pass_.capped(score) - pass_.capped(v_score))
        vs = QKVersus(key=versus, score=v_score, weight=float(weights_row[versus]), terms=pass_.terms(versus),
                      _log_odds=float(log_odds))
    row_view = pass_.row_view(visible) if row else None
    return QKTerms(tokens=tokens, layer=pass_.layer, head=pass_.head, query=query, key=key, score=score,
                   weight=float(weights_row[key]), components=comp, terms=terms, versus=vs, softcap=pass_.softcap,
                   row=row_view, row_keys=visible if row else [],
                   capped_score=pass_.capped(score) if pass_.softcap is not None else None)


def check_position(p: int, n: int, what: str) -> int:
    if not -n <= p < n:
        raise ValueError(f"The {what} position {p} is out of range: the text has {n} tokens, positions 0..{n - 1} "
                         f"(or -{n}..-1 from the end).")
    return p % n


def encode_exactly(tokenizer: Any, text: str) -> torch.Tensor:
    """``tokenizer(text).input_ids`` as a (1, pos) tensor: no chat template, nothing added beyond what the tokenizer
    adds itself (BERT's [CLS] and [SEP]; nothing for SmolLM2).

    Raises:
        ValueError: the text is empty or has no tokens.
    """
    if not text or not text.strip():
        raise ValueError("The text is empty: type a sentence (for an induction head, a repeated one).")
    ids = tokenizer(text)["input_ids"]
    if not ids:
        raise ValueError("The text has no tokens this tokenizer knows.")
    return torch.tensor([ids], dtype=torch.long)


def qk_for_request(request: Any, layer: int, head: int, query: int = -1, key: int | None = None,
                   versus: int | None = None, *, row: bool = False, device: str | None = None) -> QKTerms:
    """The QK split for a ``TraceRequest`` (its model and text), positions indexing ``tokenizer(text).input_ids``.

    Raises:
        ModelLoadError: the model cannot be loaded. ValueError: bad positions, layer, head or text.
    """
    resolved = resolve(request, device=device)
    ids = encode_exactly(resolved.tokenizer, request.text_a)
    limit = int(resolved.max_positions)
    if ids.shape[1] > limit:
        raise ValueError(f"The text has {ids.shape[1]} tokens; this model reads at most {limit}. Shorten it.")
    return qk_terms(resolved.model, resolved.tokenizer, ids, layer, head, query, key, versus, row=row)
