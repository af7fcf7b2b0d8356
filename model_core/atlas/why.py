"""Why a head looks where it does and what it writes, at its top contexts: the QK split of "Why this key"
(``model_core.qk``) averaged over a capped number of contexts, and the direct logit effect of its output there.

One full trace per text serves every head whose contexts are in that text: the QK split of a decoder is rebuilt from
the trace (``qk_pass_for_trace``, no model run); an encoder's takes the head's hooked pass.

**The QK split, above the row mean.** At query i and key j the score splits into query-side components
(``Q_c · k_j``) and key-side components (``q_i · K_c``) (``model_core.qk.terms``). A softmax only cares how far
s_ij is above the query's other scores, so each side is taken above its mean over the keys the query sees:
query side ``Q_c · (k_j − mean_j' k_j')``, key side ``q_i · (K_c(j) − mean_j' K_c(j'))``, both times the scale.
Either side sums over components to ``s_ij − mean_j' s_ij'``, the score above the row mean.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from model_core.corpus.batches import EncodedText
from model_core.corpus.model import LoadedCorpusModel
from model_core.effects.norms import freeze
from model_core.families.encoding import EncodedInput
from model_core.families.weights import layer_weights
from model_core.gate import GATE
from model_core.qk.terms import component_names, qk_pass_for_trace
from model_core.trace.forward import trace_model

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
    return query_side.numpy(), key_side.numpy()


def encoded_input(tokenizer: Any, text: EncodedText) -> EncodedInput:
    """A corpus text's ids (exactly as the atlas scanned them) as a batch of one for a full trace."""
    types = list(text.types)
    b_start = types.index(1) if 1 in types else None
    return EncodedInput(tuple(tokenizer.convert_ids_to_tokens(text.ids)), torch.tensor([text.ids]),
                        torch.tensor([types]), b_start, text.truncated)


def text_trace(loaded: LoadedCorpusModel, text: EncodedText) -> Any:
    """The full trace of one corpus text."""
    return trace_model(loaded.family, loaded.module, encoded_input(loaded.tokenizer, text), loaded.description,
                       tokenizer=loaded.tokenizer)


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


@dataclass
class _Acc:
    query: np.ndarray | None = None
    key: np.ndarray | None = None
    effect: np.ndarray | None = None
    n_qk: int = 0
    n_effect: int = 0


def explain(loaded: LoadedCorpusModel, texts: dict[int, EncodedText], wanted: dict[tuple[int, int], list[Context]], *,
            qk: bool = True, effects: bool = True,
            progress: Callable[[int, int], None] | None = None) -> tuple[dict[tuple[int, int], QKAverage],
                                                                      dict[tuple[int, int], np.ndarray]]:
    """The QK averages and the mean direct logit effect of every head of ``wanted`` over its contexts.

    Args:
        texts: every text a context names, as scanned.
        wanted: (layer, head) -> its contexts (text_id, query, key).
        progress: called with (texts done, texts) after each text.

    Returns:
        (layer, head) -> ``QKAverage``; (layer, head) -> mean effect on every logit, (vocab,) float32 (empty for a model
        without an unembedding).
    """
    by_text: dict[int, list[tuple[int, int, int, int]]] = {}
    for (layer, head), contexts in wanted.items():
        for text_id, q, k in contexts:
            by_text.setdefault(text_id, []).append((layer, head, q, k))
    acc: dict[tuple[int, int], _Acc] = {lh: _Acc() for lh in wanted}
    for done, (text_id, items) in enumerate(sorted(by_text.items())):
        trace = text_trace(loaded, texts[text_id])
        if effects:
            effect = direct_effects(loaded, trace, [(la, h, q) for la, h, q, _ in items])
            if effect is not None:
                for (la, h, _, _), row in zip(items, effect):
                    a = acc[(la, h)]
                    a.effect = row.astype(np.float64) if a.effect is None else a.effect + row
                    a.n_effect += 1
        if qk:
            for la, h, q, k in items:
                pass_ = qk_pass_for_trace(loaded.module, trace, la, h)
                qs, ks = split_above_mean(pass_, q, k)
                a = acc[(la, h)]
                a.query = qs if a.query is None else a.query + qs
                a.key = ks if a.key is None else a.key + ks
                a.n_qk += 1
        if progress is not None:
            progress(done + 1, len(by_text))
    averages, effects_out = {}, {}
    names: dict[int, list[str]] = {}
    for (la, h), a in acc.items():
        if a.n_qk:
            comp = names.setdefault(la, component_names(loaded.module, la))
            query, key = a.query / a.n_qk, a.key / a.n_qk
            averages[(la, h)] = QKAverage(comp, query, key, float(key.sum()), a.n_qk)
        if a.n_effect:
            effects_out[(la, h)] = (a.effect / a.n_effect).astype(np.float32)
    return averages, effects_out
