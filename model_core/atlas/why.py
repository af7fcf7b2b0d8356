"""Why a head looks where it does and what it writes, at its top contexts: the QK split of "Why this key"
(``model_core.qk``) averaged over a capped number of contexts, and the direct logit effect of its output there.

One pass per text (in padded batches) serves every head whose contexts are in that text: the QK split of a decoder is rebuilt from
the trace (``qk_pass_for_trace``, no model run); an encoder's takes the head's hooked pass. A long text (``long_from``
tokens or more) runs alone through ``long_arrays.long_text_arrays``, which keeps each head's output instead of the
n x n weights.

**The QK split, above the row mean.** At query i and key j the score splits into query-side components
(``Q_c · k_j``) and key-side components (``q_i · K_c``) (``model_core.qk.terms``). A softmax only cares how far
s_ij is above the query's other scores, so each side is taken above its mean over the keys the query sees:
query side ``Q_c · (k_j − mean_j' k_j')``, key side ``q_i · (K_c(j) − mean_j' K_c(j'))``, both times the scale.
Either side sums over components to ``s_ij − mean_j' s_ij'``, the score above the row mean.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from model_core.atlas import qk_hooked
from model_core.atlas.long_arrays import LongArrays, long_text_arrays
from model_core.atlas.qk_fast import HostWeights, TextSplit, supported
from model_core.corpus.batches import EncodedText, pad_batch, plan_batches
from model_core.corpus.model import LoadedCorpusModel
from model_core.effects.norms import freeze
from model_core.families.weights import layer_weights
from model_core.gate import GATE
from model_core.models.run_memory import RunMemoryError
from model_core.qk.terms import component_names, qk_pass, qk_pass_for_trace

CARD_BATCH = 16
"""Texts per batch of ``text_arrays`` at most."""
CARD_CELL_BUDGET = 2**23
"""Attention cells per batch of ``text_arrays`` (a quarter of a corpus batch's): every text's whole trace is copied to
the host, so a batch costs about 5x its weights' 34 MB (two 128-token SmolLM2 texts), held beside the pass's own."""

Context = tuple[int, int, int]
"""(text_id, query, key)."""


@dataclass(frozen=True)
class QKAverage:
    """A head's QK split above the row mean, averaged over its contexts.

    Shape: query_side, key_side (component,) float64; each sums to ``above_mean``, the mean score above the row mean.
    """

    components: list[str]
    query_side: np.ndarray
    key_side: np.ndarray
    above_mean: float
    n_contexts: int


def split_above_mean(pass_: Any, query: int, key: int) -> tuple[np.ndarray, np.ndarray]:
    """One context's query-side and key-side components of the score above the row mean (the module's docstring),
    from a pass of ``model_core.qk`` (``qk_pass``/``qk_pass_for_trace``).

    Shape: -> (component,), (component,) float64.
    """
    pass_.query = query
    visible = [j for j in range(pass_.n) if pass_.visible(j)]
    idx = torch.as_tensor(visible)
    K = pass_.K[:, idx].double()  # (C, keys, d_head)
    Q = pass_.Q  # (C, d_head) at the query
    at = visible.index(key)
    k_whole = K.sum(0)  # (keys, d_head)
    query_side = Q @ (k_whole[at] - k_whole.mean(0)) * pass_.scale
    key_part = torch.einsum("d,ckd->ck", Q.sum(0), K) * pass_.scale  # (C, keys)
    key_side = key_part[:, at] - key_part.mean(1)
    return query_side.cpu().numpy(), key_side.cpu().numpy()


@dataclass(frozen=True, eq=False)
class TextArrays:
    """What the QK split and the direct logit effect read of one text's pass: a full trace's arrays, without its
    predictions and value norms (``model_core.trace.AttentionTrace`` names them the same).

    Shape: weights (layer, head, q_pos, k_pos); queries, keys, values (layer, head, pos, d_head), keys and values
    of each query head's key/value head; hidden_states (layer + 1, pos, d_model); token_ids, token_type_ids (pos,).
    """

    token_ids: np.ndarray
    token_type_ids: np.ndarray
    weights: np.ndarray
    queries: np.ndarray
    keys: np.ndarray
    values: np.ndarray
    hidden_states: np.ndarray
    causal: bool
    score_softcap: float | None = None


def text_arrays(loaded: LoadedCorpusModel, texts: list[EncodedText], long_from: int | None = None
                ) -> Iterator[tuple[int, TextArrays | LongArrays | None]]:
    """Run the texts in padded, length-sorted batches through the family's one forward pass and cut out each text's
    arrays (right padding changes nothing for the real tokens: a decoder's never see the pads, an encoder's mask
    hides them). A text of ``long_from`` tokens or more runs alone through ``long_text_arrays`` where it serves the
    model, else it yields None (its full trace would not fit). Yields (text_id, arrays) in batch order, the long
    texts last."""
    long = [t for t in texts if long_from is not None and len(t.ids) >= long_from]
    texts = [t for t in texts if long_from is None or len(t.ids) < long_from]
    yield from _short_arrays(loaded, texts)
    fits = supported(loaded.module, loaded.family)  # the pre-norm decoders, whose values the long pass rebuilds
    for text in long:
        yield text.text_id, long_text_arrays(loaded, text) if fits else None


def _short_arrays(loaded: LoadedCorpusModel, texts: list[EncodedText]) -> Iterator[tuple[int, TextArrays]]:
    kv = torch.as_tensor(loaded.family.kv_heads(loaded.module.config), device=loaded.device)
    for batch in plan_batches(texts, CARD_BATCH, loaded.n_layers * loaded.n_heads, CARD_CELL_BUDGET):
        with GATE.turn():  # the pass and its copy to the host, as one turn of the route's gate
            ids, types, mask, _ = pad_batch(batch, loaded.tokenizer.pad_token_id or 0, loaded.device)
            out = loaded.family.forward(loaded.module, ids, types, mask, vectors=True, hidden=True)
            host = lambda layers, per_head=False: torch.stack(  # noqa: E731 - (batch, layer, head, pos, ...)
                [t.index_select(1, kv) if per_head else t for t in layers], 1).to("cpu", torch.float32).numpy()
            weights, queries = host(out.weights), host(out.queries)
            keys, values = host(out.keys, True), host(out.values, True)
            hidden = torch.stack(list(out.hidden), 1).to("cpu", torch.float32).numpy()
            softcap = getattr(out, "score_softcap", None)
            del out  # the pass's own tensors: on the CPU the host arrays above are copies of them
            # each text's own copy, the batch's arrays let go: while the next batch runs, only the text the caller
            # still holds is alive, not the whole batch twice
            cut = []
            for row, text in enumerate(batch):
                m = len(text.ids)
                per_position = [a[row, ..., :m, :].copy() for a in (queries, keys, values, hidden)]
                cut.append((text.text_id, TextArrays(
                    np.asarray(text.ids, dtype=np.int64), np.asarray(text.types, dtype=np.int64),
                    weights[row, ..., :m, :m].copy(), *per_position, loaded.family.is_decoder, softcap)))
            del weights, queries, keys, values, hidden
        cut.reverse()
        while cut:  # each text let go once the caller moves on
            yield cut.pop()


def _unembedding(loaded: LoadedCorpusModel) -> torch.Tensor | None:
    """W_U (vocab, d_model), or None for a model without one (an encoder)."""
    if not loaded.family.is_decoder:
        return None
    out = loaded.module.get_output_embeddings()
    return None if out is None else out.weight.detach()


def head_writes(loaded: LoadedCorpusModel, trace: Any, heads: list[tuple[int, int, int]]) -> torch.Tensor:
    """Each (layer, head, query)'s write into the residual stream at the query: ``(Σ_j a_qj v_j) W_O^h``.

    Shape: -> (len(heads), d_model) float32 on the CPU.
    """
    weights = layer_weights(loaded.module)
    rows = []
    for layer, head, q in heads:
        if isinstance(trace, LongArrays):
            z = torch.from_numpy(np.array(trace.z[layer, head, q], dtype=np.float32))
        else:
            z = torch.from_numpy(np.array(trace.weights[layer, head, q], dtype=np.float32)) @ \
                torch.from_numpy(np.array(trace.values[layer, head], dtype=np.float32))  # (d_head,)
        rows.append(z @ weights[layer].W_O[head].detach().to("cpu", torch.float32))
    return torch.stack(rows)


def direct_effects(loaded: LoadedCorpusModel, trace: Any, heads: list[tuple[int, int, int]]) -> np.ndarray | None:
    """Each (layer, head, query)'s direct effect on every next-token logit at the query: its write through the final
    norm frozen at the query's final residual and the unembedding (the DLA page's read-out, for every token at once).
    None for a model without an unembedding or with a norm on the attention output (Gemma 2/3, OLMo 2).

    Shape: -> (len(heads), vocab) float32.
    """
    w_u = _unembedding(loaded)
    if w_u is None or any(lw.out_norm_w is not None for lw in layer_weights(loaded.module)):
        return None
    writes = head_writes(loaded, trace, heads)
    final = torch.from_numpy(np.array(trace.hidden_states[-1], dtype=np.float32))  # (pos, d_model)
    at = torch.as_tensor([q for _, _, q in heads])
    with GATE.turn(), torch.inference_mode():  # the model's final norm module is read here
        frozen = freeze(loaded.family.final_norm(loaded.module), final[at].to(w_u.device, w_u.dtype))
        read = frozen.apply(writes.to(w_u.device, w_u.dtype))
        return (read @ w_u.T).to("cpu", torch.float32).numpy()


def _up_to_queries(text: EncodedText, items: list[tuple[int, int, int, int]], causal: bool) -> EncodedText:
    """The part of a text its card pass needs: a decoder's ends at its contexts' last query. Under the causal mask no
    position sees a later one, so every array a split or a direct effect reads (the stream, the queries, the keys and
    the writes at the query and before it) is the same in the shorter pass, which costs less: the 1,000-text atlas's
    cards ran about 160 texts again."""
    end = max(q for _, _, q, _ in items) + 1
    if not causal or end >= len(text.ids):
        return text
    return replace(text, ids=text.ids[:end], types=text.types[:end])


@dataclass
class _Acc:
    query: np.ndarray | None = None
    key: np.ndarray | None = None
    effect: np.ndarray | None = None
    n_qk: int = 0
    n_effect: int = 0


def explain(loaded: LoadedCorpusModel, texts: dict[int, EncodedText], wanted: dict[tuple[int, int], list[Context]], *,
            qk: bool = True, effects: bool = True, fast_qk: bool = True, long_from: int | None = None,
            progress: Callable[[int, int], None] | None = None) -> tuple[dict[tuple[int, int], QKAverage],
                                                                      dict[tuple[int, int], np.ndarray]]:
    """The QK averages and the mean direct logit effect of every head of ``wanted`` over its contexts.

    Args:
        texts: every text a context names, as scanned.
        wanted: (layer, head) -> its contexts (text_id, query, key).
        fast_qk: split by ``model_core.atlas.qk_fast`` (decoders, from the trace) or ``qk_hooked`` (encoders, one
            hooked pass per text) where they serve the model (the same numbers, tests hold); False:
            ``model_core.qk``'s pass for every head.
        long_from: from this many tokens a text's card pass is ``long_arrays.long_text_arrays`` (no n x n pattern),
            where it serves the model; elsewhere such a text's contexts are split by ``model_core.qk``'s pass per
            head (refused, and left out, past ``AE_RUN_MEMORY_MB``) and have no direct effect. None: every text is
            traced in full.
        progress: called with (texts done, texts) after each text, and again after each head's split.

    Returns:
        (layer, head) -> ``QKAverage``; (layer, head) -> mean effect on every logit, (vocab,) float32 (empty for a model
        without an unembedding).
    """
    by_text: dict[int, list[tuple[int, int, int, int]]] = {}
    for (layer, head), contexts in wanted.items():
        for text_id, q, k in contexts:
            by_text.setdefault(text_id, []).append((layer, head, q, k))
    acc: dict[tuple[int, int], _Acc] = {lh: _Acc() for lh in wanted}
    quick = fast_qk and supported(loaded.module, loaded.family)
    hooked = fast_qk and not quick and qk_hooked.supported(loaded.module, loaded.family)
    names: dict[int, list[str]] = {}
    host_weights = HostWeights(loaded.module)  # a GPU's attention weights copied to the host once a run, not a text
    traced = [_up_to_queries(texts[t], by_text[t], loaded.family.is_decoder) for t in sorted(by_text)]
    for done, (text_id, trace) in enumerate(text_arrays(loaded, traced, long_from)):
        items = by_text[text_id]
        if effects and trace is not None:
            effect = direct_effects(loaded, trace, [(la, h, q) for la, h, q, _ in items])
            if effect is not None:
                for (la, h, _, _), row in zip(items, effect):
                    a = acc[(la, h)]
                    a.effect = row.astype(np.float64) if a.effect is None else a.effect + row
                    a.n_effect += 1
        if qk:
            def add(item: tuple[int, int, int, int], qs: np.ndarray, ks: np.ndarray, done: int = done) -> None:
                a = acc[item[:2]]
                a.query = qs if a.query is None else a.query + qs
                a.key = ks if a.key is None else a.key + ks
                a.n_qk += 1
                if progress is not None:  # a Stop between heads, not only between texts
                    progress(done, len(by_text))

            for la, *_ in items:
                if la not in names:
                    names[la] = component_names(loaded.module, la)
            if trace is None:  # a long text the card pass does not serve: the head's own pass, where it fits
                ids = torch.tensor([texts[text_id].ids], dtype=torch.long)
                for la, h, q, k in items:
                    try:
                        add((la, h, q, k), *split_above_mean(qk_pass(loaded.module, ids, la, h), q, k))
                    except RunMemoryError:
                        continue
            elif quick:
                fast = TextSplit(loaded.module, loaded.family, trace, weights=host_weights)
                for item, sides in fast.split_many(items, [names[la][-1] == "bias" for la, *_ in items]):
                    add(item, *sides)
            elif hooked and qk_hooked.fits(loaded.module, loaded.family, len(trace.token_ids),
                                           max(la for la, *_ in items)):
                with GATE.turn():  # one hooked pass of the model for every head of this text
                    qk_hooked.TextPass(loaded.module, loaded.family, trace, items, add)
            else:
                for la, h, q, k in items:
                    add((la, h, q, k), *split_above_mean(qk_pass_for_trace(loaded.module, trace, la, h), q, k))
        if progress is not None:
            progress(done + 1, len(by_text))
    averages, effects_out = {}, {}
    for (la, h), a in acc.items():
        if a.n_qk:
            if la not in names:
                names[la] = component_names(loaded.module, la)
            comp = names[la]
            query, key = a.query / a.n_qk, a.key / a.n_qk
            averages[(la, h)] = QKAverage(comp, query, key, float(key.sum()), a.n_qk)
        if a.n_effect:
            effects_out[(la, h)] = (a.effect / a.n_effect).astype(np.float32)
    return averages, effects_out
