"""Every attention and analysis page opened on a tiny decoder (?model=pretrained&model_id=<folder>): no exception,
and the page speaks the family's language (the first token, the last token, grouped-query heads), never [CLS].

The bertviz adapter's decoder behaviour (a GPT-2 skeleton, kv-head labels, the score scale) is checked without
Streamlit at the end.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from app_runs import plotly_z
from streamlit.testing.v1 import AppTest

from attention_explorer import views as bv
from model_core import TraceRequest, build_trace

ROOT = Path(__file__).resolve().parents[1]
APP = str(ROOT / "app.py")
VENDOR_MISSING = bool(bv.vendor_missing(str(ROOT / "static")))

# page -> what it is called on the screen (st.title or st.header)
PAGES = {
    "pages/heatmaps.py": "Attention heatmaps",
    "pages/causal.py": "Causal mask & masked scores",
    "pages/bertviz.py": "bertviz views",
    "pages/inside.py": "Inside a decoder block",
    "pages/analysis_contexts.py": "One word, two contexts",
    "pages/analysis_rollout.py": "Attention rollout and attention flow",
    "pages/analysis_norms.py": "Norm-weighted attention",
    "pages/analysis_head_stats.py": "Head statistics",
    "pages/analysis_masking.py": "Head masking",
    "pages/head_roles.py": "Head roles",
}


def _run(at: AppTest) -> AppTest:
    """One run through app.py (see tests/test_pages.py: a stale context would skip the sidebar)."""
    if "_app_context" in at.session_state:
        del at.session_state["_app_context"]
    at.run()
    return at


def _open(folder: Path, page: str, **state) -> AppTest:
    """The app linked to the decoder in ``folder`` with the pair "time flies…" / "fruit flies…", on ``page``."""
    at = AppTest.from_file(APP, default_timeout=180)
    for name, value in {"model": "pretrained", "model_id": str(folder), "a": "time flies like an arrow",
                        "b": "fruit flies like a banana"}.items():
        at.query_params[name] = value
    for key, value in state.items():
        at.session_state[key] = value
    _run(at)
    _clean(at)
    at.switch_page(page)
    _run(at)
    _clean(at)
    trace = at.session_state["_app_context"].trace
    assert trace is not None and trace.is_decoder, at.session_state["_app_context"].error
    assert PAGES[page] in [*(t.value for t in at.title), *(h.value for h in at.header)]
    return at


def _clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def _text(at: AppTest) -> str:
    """Everything the page (not the sidebar) wrote: markdown, captions, infos, labels, and the charts' titles (a
    grid's title in a figure of grids too) and legends."""
    parts = [e.value for kind in ("markdown", "caption", "info", "subheader", "header", "title", "warning")
             for e in at.main.get(kind)]
    parts += [w.label for kind in ("toggle", "selectbox", "radio", "metric", "download_button", "expander")
              for w in at.main.get(kind)]
    parts += [json.dumps(json.loads(c.proto.spec).get("layout", {}).get("title", {})) for c in at.get("plotly_chart")]
    # A figure of several grids titles each with an annotation (attention_explorer.head_grids), wrapped with <br>.
    parts += [a.get("text", "").replace("<br>", " ") for c in at.get("plotly_chart")
              for a in json.loads(c.proto.spec).get("layout", {}).get("annotations", [])]
    parts += [json.dumps([d.get("name") for d in json.loads(c.proto.spec).get("data", [])])
              for c in at.get("plotly_chart")]
    return "\n".join(str(p) for p in parts)


@pytest.fixture(scope="module")
def llama(tiny_decoders) -> Path:
    """The Llama-like tiny decoder: a BOS token, 4 query heads sharing 2 key/value heads."""
    return tiny_decoders["llama"]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("page", list(PAGES))
def test_every_page_opens_on_a_decoder_and_never_says_cls(tiny_decoders, page, family):
    at = _open(tiny_decoders[family], page, mask_off_heads=[(0, 1)])
    text = _text(at)
    if page != "pages/inside.py":  # the walk's note names the encoder it is about
        assert "[CLS]" not in text and "[SEP]" not in text, [line for line in text.splitlines() if "CLS" in line]


@pytest.mark.slow
def test_heatmaps_show_the_causal_triangle_and_the_first_token_sink(llama):
    from attention_explorer.figures import MASKED_WEIGHT_COLOR

    at = _open(llama, "pages/heatmaps.py")
    text = _text(at)
    assert "Hide the first token and other special tokens" in text
    assert "Share to the first token" in text and "attention sink" in text and "lower triangle" in text
    assert "Share to previous token" in text  # no later special tokens: the fourth grid says so and swaps
    focus = [spec for spec in (json.loads(c.proto.spec) for c in at.get("plotly_chart"))
             if spec["layout"].get("plot_bgcolor") == MASKED_WEIGHT_COLOR]
    assert len(focus) == 1  # the focused head: masked cells are gaps on a grey ground
    z = plotly_z(focus[0]["data"][0])
    n = at.session_state["_app_context"].trace.n_tokens
    assert z.shape == (n, n)
    above = np.triu(np.ones((n, n), dtype=bool), 1)
    assert np.isnan(z[above]).all() and np.isfinite(z[~above]).all()
    labels = focus[0]["data"][0]["y"]  # "i: token", the byte-level pieces decoded with their spaces visible
    assert "3: ␣flies" in labels and not any("Ġ" in label for label in labels)

    at.toggle(key="hide_special").set_value(True)
    _run(at)
    _clean(at)
    focus = [spec for spec in (json.loads(c.proto.spec) for c in at.get("plotly_chart"))
             if spec["layout"].get("plot_bgcolor") == MASKED_WEIGHT_COLOR]
    labels = focus[0]["data"][0]["y"]
    assert len(labels) == n - 1 and labels[0].startswith("1: ")  # the first token (a BOS here) is hidden


@pytest.mark.slow
def test_heatmaps_merge_bpe_pieces_into_words(llama):
    at = _open(llama, "pages/heatmaps.py", ctl_words=True)
    assert any("Words, not BPE pieces" in i.value for i in at.info), [i.value for i in at.info]
    ctx = at.session_state["_app_context"]
    assert "time" in ctx.words.words and ctx.words.n_words < ctx.trace.n_tokens


@pytest.mark.slow
def test_causal_page_shows_the_decoders_own_mask_and_derives_the_unmasked_row(llama):
    at = _open(llama, "pages/causal.py")
    text = _text(at)
    assert "Causal (the Llama-like decoder's own mask)" in text
    assert "Bidirectional — derived from this Llama-like decoder's scores" in text
    assert "reads key/value head 0 (heads 0–1 share it)" in text  # the focused head 0, grouped-query attention
    # The scores once (both rows share them), the mask and weights in each row, and the causal row's masked
    # scores: the unmasked row's masked scores are the scores, said in words instead of drawn twice.
    assert len(at.get("plotly_chart")) == 6
    assert any("The scores are the same for both rows" in i.value for i in at.info)
    assert any("Nothing is masked in this row" in i.value for i in at.info)


@pytest.mark.slow
@pytest.mark.skipif(VENDOR_MISSING, reason="static/vendor/ missing: run scripts/install_assets.sh")
@pytest.mark.parametrize("kind", bv.VIEW_KINDS)
def test_bertviz_draws_each_view_of_a_decoder(llama, kind):
    at = _open(llama, "pages/bertviz.py", bv_kind=kind)
    assert len(at.get("iframe")) == 1
    assert "causal" in _text(at)
    if kind == "neuron":
        assert any("Grouped-query attention" in i.value and "kv 1 ← heads 2–3" in i.value for i in at.info)


@pytest.mark.slow
def test_inside_walks_a_llama_block_step_by_step(llama):
    from ui.inside_decoder import STEPS

    at = _open(llama, "pages/inside.py")
    labels = [e.label for e in at.main.expander]
    assert len(labels) == len(STEPS) and labels[5] == "6 · Scores, the causal mask and softmax", labels
    text = _text(at)
    assert "−∞" in text and "RoPE" not in text  # step 5 is closed: nothing of it was built
    n = at.session_state["_app_context"].trace.n_tokens
    weights = [spec for spec in (json.loads(c.proto.spec) for c in at.get("plotly_chart"))
               if "softmax" in json.dumps(spec["layout"].get("title", {}))]
    z = plotly_z(weights[0]["data"][0])
    assert z.shape == (n, n) and np.isnan(z[np.triu_indices(n, 1)]).all()  # the causal triangle, masked cells gaps
    for step in range(1, len(STEPS) + 1):
        at.session_state[f"inside_step{step}"] = True
    _run(at)
    _clean(at)
    text = _text(at)
    for said in ("RMSNorm", "rotary embedding", "grouped-query attention", "SwiGLU", "unembedding", "shape (4,"):
        assert said in text, said
    assert len(at.get("plotly_chart")) >= 20
    next_tokens = at.main.dataframe[-1].value
    assert list(next_tokens.columns) == ["next token", "id", "probability"] and len(next_tokens) == 10


@pytest.mark.slow
def test_inside_says_plainly_which_decoders_it_cannot_walk(tiny_decoders):
    at = _open(tiny_decoders["gpt2"], "pages/inside.py")
    info = " ".join(i.value for i in at.info)
    assert "covers Llama-like decoders" in info and "RMSNorm" in info and "rotary" in info
    assert not at.get("plotly_chart") and not at.main.expander
    assert at.sidebar.selectbox(key="sel_layer") is not None  # the head picker still works here


@pytest.mark.slow
def test_rollout_relevance_is_to_the_last_token(llama):
    text = _text(_open(llama, "pages/analysis_rollout.py"))
    assert "Relevance of each input token to the last token" in text
    assert "Relevance to the last token (CSV)" in text


@pytest.mark.slow
def test_norms_name_the_first_token(llama):
    text = _text(_open(llama, "pages/analysis_norms.py"))
    assert "raw first token" in text and "Share on first token" in text
    assert "no other special tokens" in text


@pytest.mark.slow
def test_head_stats_offer_the_first_token_and_say_why_special_tokens_are_missing(llama):
    at = _open(llama, "pages/analysis_head_stats.py")
    options = at.selectbox(key="stats_name").options
    assert "Share to the first token" in options and "Share to other special tokens" not in options
    assert "is left out: this input has none" in _text(at)


@pytest.mark.slow
def test_masking_shows_the_next_token_prediction(llama):
    at = _open(llama, "pages/analysis_masking.py", mask_off_heads=[(0, 1), (1, 3)])
    labels = [m.label for m in at.metric]
    assert labels == ["Most likely next token", "Total variation", "KL divergence (bits)"]
    assert float(at.metric[1].value) > 0
    text = _text(at)
    assert "Next-token prediction after position" in text and "The last token's hidden state" in text
    assert len(at.dataframe) == 1


@pytest.mark.slow
def test_contexts_compare_bpe_words(llama):
    at = _open(llama, "pages/analysis_contexts.py")
    assert at.selectbox(key="ctx_word").options == ["flies", "like"]
    assert "first token" in _text(at)


# -- the bertviz adapter, without Streamlit ---------------------------------------------------------
@pytest.fixture(scope="module")
def llama_trace(llama):
    return build_trace(TraceRequest("pretrained", "time flies like an arrow", model_id=str(llama)), device="cpu")


def test_neuron_view_of_a_decoder_uses_the_gpt2_skeleton_and_labels_kv_heads(llama_trace):
    from bertviz_decode import decode_params

    view = bv.view_html("neuron", llama_trace, layers=[1], heads=[2])
    params = decode_params(view)
    assert params["bidirectional"] is False and 'id="filter"' not in view.html  # one sentence: no A/B menu
    assert '["0 · kv 0","1 · kv 0","2 · kv 1","3 · kv 1"]' in view.html.replace("\\u00b7", "·")
    sent = np.asarray(params["attention"]["all"]["queries"])
    np.testing.assert_allclose(sent[0], llama_trace.queries[1], atol=5e-4)  # the post-rotary queries
    keys = np.asarray(params["attention"]["all"]["keys"])[0]
    np.testing.assert_array_equal(keys[0], keys[1])  # heads 0 and 1 share key/value head 0


def test_bertviz_views_label_a_decoders_pieces_as_they_read(llama_trace):
    from bertviz_decode import decode_params

    params = decode_params(bv.view_html("head", llama_trace, layers=[0]))
    assert "␣flies" in params["attention"][0]["left_text"]
    assert not any("Ġ" in t for t in params["attention"][0]["left_text"])


def test_kv_legend_says_which_heads_share_each_key_value_head(llama_trace):
    legend = "4 query heads share 2 key/value heads: kv 0 ← heads 0–1 · kv 1 ← heads 2–3"
    assert bv.kv_legend(llama_trace) == legend


def test_gpt2_has_no_kv_legend_and_its_menu_is_plain(tiny_decoders):
    trace = build_trace(TraceRequest("pretrained", "time flies", model_id=str(tiny_decoders["gpt2"])), device="cpu")
    assert bv.kv_legend(trace) is None
    assert "· kv" not in bv.view_html("neuron", trace).html.replace("\\u00b7", "·")


def test_the_neuron_view_draws_a_models_own_score_scale(tiny_decoders):
    """bertviz draws q·k/√d: Gemma's other scale is folded into the queries so the drawn scores are its own."""
    from dataclasses import replace

    from bertviz_decode import decode_params

    trace = build_trace(TraceRequest("pretrained", "time flies", model_id=str(tiny_decoders["gemma"])), device="cpu")
    other = replace(trace, score_scale=trace.score_scale * 2)
    q = np.asarray(decode_params(bv.view_html("neuron", other))["attention"]["all"]["queries"])[0]
    np.testing.assert_allclose(q, trace.queries[0] * 2 * trace.score_scale * np.sqrt(trace.d_head), atol=2e-3)


def test_a_word_level_trace_keeps_its_pieces_byte_level_answer(llama_trace):
    from model_core.words import word_level_trace

    words = word_level_trace(llama_trace, llama_trace.words())
    assert llama_trace.byte_level and words.byte_level  # its words lost their "Ġ" marks, not their encoding


def test_a_word_level_trace_of_split_words_predicts_after_each_word(tiny_decoders):
    from model_core.words import word_level_trace

    trace = build_trace(TraceRequest("pretrained", "the embeddings of unaffordable tokenizers",
                                     model_id=str(tiny_decoders["llama"])), device="cpu")
    spans = trace.words()
    assert spans.n_words < trace.n_tokens  # the tiny vocabulary splits these words
    words = word_level_trace(trace, spans)
    assert words.n_tokens == spans.n_words
    np.testing.assert_array_equal(words.next_token_ids, trace.next_token_ids[[b - 1 for _, b in spans.spans]])
