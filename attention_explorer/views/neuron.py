"""bertviz's neuron view of an AttentionTrace: how one query and the keys make the weights, for every family.

The neuron view's Python half only runs bertviz's forked BERT and GPT-2 classes, so its numbers come
from the trace (queries, keys and weights, for every family alike: a decoder's queries and keys after the
rotary embedding, each key its key/value head's): bertviz builds its page around a one-token stand-in, and
the stand-in's parameters are swapped for the trace's. Its script draws q·k/√d; a model that scales
scores otherwise (Gemma) gets its queries pre-scaled so that the drawn scores are the model's. With
grouped-query attention, the head menu names each head's key/value head.

No streamlit here; bertviz (which imports IPython) is imported inside the functions.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from attention_explorer.views.assets import DEFAULT_ASSET_BASE
from attention_explorer.views.page import (
    CONTROLS_PX,
    BertvizView,
    find_params,
    finish,
    quantize,
    safe_json,
    shown,
)
from attention_explorer.views.size import check_indices, count_elements
from model_core.trace.trace import AttentionTrace

# bertviz layout constants (neuron_view.js), for the page height.
_NEURON_BOX_HEIGHT, _NEURON_PADDING = 26, 100


class _StandInTokenizer:
    """Enough of a tokenizer for bertviz's neuron_view.get_attention on a one-word stand-in.

    Its markers only pad bertviz's skeleton (bertviz adds them for model type "bert"): the page shows the
    trace's own tokens, whatever the family.
    """

    cls_token = "<first>"
    sep_token = "<sep>"

    def tokenize(self, text: str) -> list[str]:
        return [text]

    def convert_tokens_to_ids(self, tokens: list[str]) -> list[int]:
        return list(range(len(tokens)))


class _StandInModel:
    """Replays a tiny attention so that bertviz's neuron view builds its page skeleton."""

    def eval(self) -> None:
        return None

    def __call__(self, input_ids: Any, token_type_ids: Any = None) -> tuple[Any, list[dict[str, Any]]]:
        import torch

        n = int(input_ids.shape[1])
        attn = torch.full((1, 1, n, n), 1.0 / n)
        vectors = torch.zeros((1, 1, n, 1))
        return None, [{"attn": attn, "queries": vectors, "keys": vectors}]


def neuron_params(
    trace: AttentionTrace, layer: int, token_window: tuple[int, int] | None = None
) -> dict[str, dict[str, Any]]:
    """The ``attention`` structure bertviz's neuron view reads, built from the trace.

    Same keys as bertviz's ``neuron_view.get_attention`` ("all", and for pairs "aa", "ab", "ba",
    "bb"), for one layer and all its heads; numbers are integers in 1/SCALE and the pair blocks
    are ``{"ae_block": [row0, row1, col0, col1]}`` ranges into "all" (see ``aeExpand``).

    Shape: all.attn is (1, head, q_pos, k_pos); all.queries and all.keys are (1, head, pos, d_head).
    """
    window = shown(trace, token_window)
    layer = check_indices("layer", [layer], trace.n_layers)[0]
    from bertviz.neuron_view import format_special_chars  # bertviz's own token clean-up

    tokens = format_special_chars(window.tokens)
    # bertviz's script draws q·k/√d_head: fold any other score scale (Gemma's) into the queries.
    query_scale = float(trace.score_scale) * math.sqrt(trace.d_head)
    queries = window.queries[layer]
    if not math.isclose(query_scale, 1.0, rel_tol=1e-6):
        queries = queries * np.float32(query_scale)
    params: dict[str, dict[str, Any]] = {
        "all": {
            "attn": [quantize(window.weights[layer]).tolist()],
            "queries": [quantize(queries).tolist()],
            "keys": [quantize(window.keys[layer]).tolist()],
            "left_text": tokens,
            "right_text": tokens,
        }
    }
    b = window.sentence_b_start
    if b is not None:
        n = len(tokens)
        spans = {"a": (0, b), "b": (b, n)}
        for rows, cols in ("aa", "bb", "ab", "ba"):
            (r0, r1), (c0, c1) = spans[rows], spans[cols]
            params[rows + cols] = {
                "attn": {"ae_block": [r0, r1, c0, c1]},
                "left_text": tokens[r0:r1],
                "right_text": tokens[c0:c1],
            }
    return params


def neuron_view_html(
    trace: AttentionTrace,
    layer: int = 0,
    head: int = 0,
    token_window: tuple[int, int] | None = None,
    asset_base: str | None = DEFAULT_ASSET_BASE,
) -> BertvizView:
    """bertviz's neuron view: how one query and the keys make the weights, for either model.

    The queries and keys come from the trace, so the custom encoder gets a neuron view too.
    One layer is sent (its number is shown in place of bertviz's layer menu); the head menu
    offers all its heads.

    Args:
        trace: the forward pass to show.
        layer: the layer shown.
        head: the head shown first.
        token_window: (start, stop) positions to show, half-open; None for the whole input.
        asset_base: where the page loads require.js, d3 and jQuery from; None inlines them.

    Raises:
        ValueError: layer, head or window out of range.
    """
    from bertviz.neuron_view import show

    check_indices("head", [head], trace.n_heads)
    params_attention = neuron_params(trace, layer, token_window)
    pair = "aa" in params_attention
    # bertviz's GPT-2 skeleton draws a causal head (and takes no pair); its BERT skeleton has the pair menu.
    html = show(
        _StandInModel(),
        "gpt2" if trace.causal and not pair else "bert",
        _StandInTokenizer(),
        "a",
        "b" if pair else None,
        display_mode="light",
        layer=0,
        head=head,
        html_action="return",
    ).data
    marker = "window.bertviz_params = "
    start, end, params = find_params(html, marker)
    params["attention"] = params_attention
    params["bidirectional"] = not trace.causal
    # bertviz's layer menu would list the one layer sent as "0": show its real number instead.
    html = html.replace(
        '<span class="dropdown-label">Layer: </span><select id="layer"></select>',
        f'<span class="dropdown-label">Layer: {int(layer)} </span><select id="layer" style="display:none"></select>',
    )
    html = _label_kv_heads(html, trace)
    start, end, _ = find_params(html, marker)
    n = len(params_attention["all"]["left_text"])
    return BertvizView(
        kind="neuron",
        html=finish(html, "neuron", params, (start, end), asset_base),
        height=math.ceil(n * _NEURON_BOX_HEIGHT + _NEURON_PADDING) + CONTROLS_PX,
        n_tokens=n,
        n_elements=count_elements("neuron", n, 1, 1, trace.d_head),
    )


_HEAD_OPTION = 'headSelect.append($("<option />").val(i).text(i));'
"""The line of bertviz 1.4's neuron_view.js that fills the head menu."""


def kv_head_groups(trace: AttentionTrace) -> list[tuple[int, list[int]]]:
    """Each key/value head with the query heads that read it, in order: [(kv_head, [head, ...]), ...]."""
    kv_heads = np.asarray(trace.kv_heads)
    return [(kv, np.flatnonzero(kv_heads == kv).tolist()) for kv in range(int(kv_heads.max()) + 1)]


def kv_legend(trace: AttentionTrace) -> str | None:
    """A line saying which query heads share each key/value head, or None without grouped-query attention.

    E.g. "9 query heads share 3 key/value heads: kv 0 ← heads 0–2 · kv 1 ← heads 3–5 · kv 2 ← heads 6–8".
    """
    if trace.n_kv_heads == trace.n_heads:
        return None

    def span(heads: list[int]) -> str:
        return (f"{heads[0]}–{heads[-1]}" if len(heads) > 1 and heads == list(range(heads[0], heads[-1] + 1))
                else ", ".join(map(str, heads)))

    groups = " · ".join(f"kv {kv} ← heads {span(heads)}" for kv, heads in kv_head_groups(trace))
    return f"{trace.n_heads} query heads share {trace.n_kv_heads} key/value heads: {groups}"


def _label_kv_heads(html: str, trace: AttentionTrace) -> str:
    """With grouped-query attention, name each head's key/value head in the neuron view's head menu ("4 · kv 1").

    Raises:
        RuntimeError: the installed bertviz fills its head menu differently from 1.4.1.
    """
    if trace.n_kv_heads == trace.n_heads:
        return html
    if _HEAD_OPTION not in html:
        raise RuntimeError("bertviz's neuron view no longer fills its head menu as 1.4.1 did; update "
                           "attention_explorer/views/neuron._HEAD_OPTION to the installed neuron_view.js.")
    labels = safe_json([f"{h} · kv {int(kv)}" for h, kv in enumerate(trace.kv_heads)])
    return html.replace(_HEAD_OPTION, f'headSelect.append($("<option />").val(i).text({labels}[i]));')


