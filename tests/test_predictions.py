"""What a decoder predicts: next-token rows and the logit lens against a naive reference on tiny decoders, the
figures, and the "What the model predicts" page (AppTest) with a decoder and with BERT."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from model_core import TraceRequest, build_trace
from model_core.models.loading import load_pretrained
from model_core.analysis.predictions import LogitLens, actual_next_ranks, logit_lens, next_token_rows
from model_core.io.tables import rows_to_csv

ROOT = Path(__file__).resolve().parents[1]
TEXT_A, TEXT_B = "time flies like an arrow", "fruit flies like a banana"


@pytest.fixture(scope="module")
def decoder_traces(tiny_decoders):
    """family -> (loaded model, trace of the pair)."""
    out = {}
    for family, folder in tiny_decoders.items():
        loaded = load_pretrained(str(folder), device="cpu")
        request = TraceRequest("pretrained", TEXT_A, TEXT_B, model_id=str(folder))
        out[family] = loaded, build_trace(request, device="cpu")
    return out


def _final_norm(model) -> torch.nn.Module:
    if hasattr(model, "transformer"):  # GPT-2
        return model.transformer.ln_f
    return getattr(model.model, "norm", None) or model.model.final_layernorm  # Phi names it final_layernorm


def _naive_lens_probs(model, input_ids: list[int]) -> torch.Tensor:
    """Every layer's next-token distribution from transformers' own hidden states: the residual stream entering
    each layer (embeddings, then layers 0 .. L-2) through the final norm and the unembedding, and the model's own
    logits for the last layer (transformers' last hidden state is already normed). Shape: (layer + 1, pos, vocab)."""
    with torch.no_grad():
        out = model(torch.tensor([input_ids]), output_hidden_states=True, use_cache=False)
        rows = [model.get_output_embeddings()(_final_norm(model)(h[0])) for h in out.hidden_states[:-1]]
        cap = getattr(model.config, "final_logit_softcapping", None)  # Gemma 2 caps its logits, as model() does
        rows = [r if cap is None else torch.tanh(r / cap) * cap for r in rows]
        rows.append(out.logits[0])
    return torch.softmax(torch.stack(rows).float(), dim=-1)


# -- the logit lens ------------------------------------------------------------------------------------------

def test_logit_lens_equals_a_naive_reference_at_every_position(tiny_decoder, decoder_traces):
    loaded, trace = decoder_traces[tiny_decoder.name]
    reference = _naive_lens_probs(loaded.model, [int(i) for i in trace.token_ids])  # (layer + 1, pos, vocab)
    assert reference.shape[0] == trace.n_layers + 1
    for pos in range(trace.n_tokens):
        lens = logit_lens(loaded, trace, pos, k=5)
        top = reference[:, pos].topk(5, dim=-1)
        # Log-probabilities: near-uniform tiny models give probabilities too small for a relative check to see.
        np.testing.assert_allclose(np.log(lens.top_probs), top.values.log().numpy(), atol=3e-5)
        # Ids must agree wherever the reference's probabilities are not tied.
        gaps = np.diff(top.values.numpy(), axis=-1) < -1e-5
        distinct = np.concatenate([gaps, np.ones((gaps.shape[0], 1), bool)], axis=1) & np.concatenate(
            [np.ones((gaps.shape[0], 1), bool), gaps], axis=1)
        assert (lens.top_ids == top.indices.numpy())[distinct].all()
        final = int(reference[-1, pos].argmax())
        assert lens.final_id == final
        np.testing.assert_allclose(np.log(lens.final_probs), reference[:, pos, final].log().numpy(), atol=3e-5)
        naive_ranks = (reference[:, pos] > reference[:, pos, final, None]).sum(-1).numpy() + 1
        assert (lens.final_ranks == naive_ranks).all()


def test_the_last_layers_lens_is_the_traces_own_next_token_prediction(tiny_decoder, decoder_traces):
    loaded, trace = decoder_traces[tiny_decoder.name]
    for pos in range(trace.n_tokens):
        lens = logit_lens(loaded, trace, pos, k=10)
        assert list(lens.top_ids[-1]) == list(trace.next_token_ids[pos])
        np.testing.assert_allclose(lens.top_probs[-1], trace.next_token_probs[pos], rtol=1e-5, atol=1e-7)
        assert lens.top_strings[-1] == trace.next_token_strings[pos]
        assert lens.final_id == trace.next_token_ids[pos, 0] and lens.final_ranks[-1] == 1


def test_the_lens_of_a_head_masked_trace_reads_that_traces_residual_stream(decoder_traces):
    loaded, trace = decoder_traces["llama"]
    off = np.ones((trace.n_layers, trace.n_heads), dtype=bool)
    off[:, 0] = False
    masked = build_trace(TraceRequest("pretrained", TEXT_A, TEXT_B, model_id=loaded.source.model_id,
                                      head_mask=off), device="cpu")
    last = masked.n_tokens - 1
    lens = logit_lens(loaded, masked, last)
    assert list(lens.top_ids[-1]) == list(masked.next_token_ids[last, :5])
    assert not np.allclose(lens.top_probs, logit_lens(loaded, trace, last).top_probs)


def test_lens_rows_are_embeddings_then_every_layer(decoder_traces):
    loaded, trace = decoder_traces["gpt2"]
    lens = logit_lens(loaded, trace, 2, k=3)
    assert isinstance(lens, LogitLens)
    assert lens.row_labels == ("embeddings", *(f"layer {i}" for i in range(trace.n_layers)))
    assert lens.top_ids.shape == lens.top_probs.shape == (trace.n_layers + 1, 3)
    assert (np.diff(lens.top_probs, axis=1) <= 0).all()  # best first
    assert lens.token == trace.tokens[2] and lens.position == 2
    with pytest.raises(ValueError):
        lens.top_probs[0, 0] = 1.0  # read-only


@pytest.mark.parametrize("position", [-1, 10_000, 1.5, True])
def test_a_bad_position_is_refused_with_the_range(decoder_traces, position):
    loaded, trace = decoder_traces["llama"]
    with pytest.raises(ValueError, match="position|Position"):
        logit_lens(loaded, trace, position)


def test_a_bad_k_is_refused(decoder_traces):
    loaded, trace = decoder_traces["llama"]
    with pytest.raises(ValueError, match="k must be"):
        logit_lens(loaded, trace, 0, k=0)


def test_the_lens_refuses_an_encoder(bundled, bert_pair_trace):
    with pytest.raises(ValueError, match="the logit lens needs a decoder language model"):
        logit_lens(bundled, bert_pair_trace, 0)


def test_the_lens_refuses_a_trace_from_another_model(decoder_traces):
    loaded, _ = decoder_traces["llama"]
    _, other = decoder_traces["gpt2"]
    with pytest.raises(ValueError, match="not made by"):
        logit_lens(loaded, other, 0)


# -- next-token rows -----------------------------------------------------------------------------------------

def test_next_token_rows_list_every_position_and_rank_best_first(decoder_traces):
    _, trace = decoder_traces["qwen2"]
    rows = next_token_rows(trace)
    k = trace.next_token_ids.shape[1]
    assert len(rows) == trace.n_tokens * k
    assert list(rows[0]) == ["position", "token", "rank", "predicted", "predicted_id", "probability"]
    for pos in range(trace.n_tokens):
        block = rows[pos * k:(pos + 1) * k]
        assert [r["rank"] for r in block] == list(range(1, k + 1))
        assert {r["token"] for r in block} == {trace.tokens[pos]} and {r["position"] for r in block} == {pos}
        assert [r["predicted_id"] for r in block] == list(trace.next_token_ids[pos])
        probs = [float(r["probability"]) for r in block]
        assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-6


def test_next_token_rows_read_back_from_csv_exactly(decoder_traces):
    _, trace = decoder_traces["llama"]
    rows = next_token_rows(trace)
    back = list(csv.DictReader(io.StringIO(rows_to_csv(rows))))
    assert len(back) == len(rows)
    assert [np.float32(r["probability"]) for r in back] == [r["probability"] for r in rows]
    assert [r["predicted"] for r in back] == [r["predicted"] for r in rows]  # spaces and line breaks kept


def test_next_token_rows_refuse_an_encoder(bert_pair_trace):
    with pytest.raises(ValueError, match="predicts no next token"):
        next_token_rows(bert_pair_trace)


def test_actual_next_ranks_find_the_following_token_among_the_predictions(decoder_traces):
    _, trace = decoder_traces["gemma"]
    ranks = actual_next_ranks(trace)
    assert len(ranks) == trace.n_tokens and ranks[-1] is None
    for pos, rank in enumerate(ranks[:-1]):
        ids = list(trace.next_token_ids[pos])
        following = int(trace.token_ids[pos + 1])
        assert rank == (ids.index(following) + 1 if following in ids else None)


def test_lens_rows_for_the_csv(decoder_traces):
    loaded, trace = decoder_traces["mistral"]
    lens = logit_lens(loaded, trace, 3, k=4)
    rows = lens.to_rows()
    assert len(rows) == lens.n_rows * 4
    assert rows[0]["layer"] == "embeddings" and rows[-1]["layer"] == f"layer {trace.n_layers - 1}"
    assert rows[-4]["predicted"] == lens.final_string and rows[-4]["final_rank"] == 1
    assert rows_to_csv(rows).splitlines()[0] == ("position,token,layer,rank,predicted,predicted_id,probability,"
                                                 "final_prediction,final_probability,final_rank")


# -- figures and the table -----------------------------------------------------------------------------------

def _fake_lens(rows: int, k: int = 5) -> LogitLens:
    rng = np.random.default_rng(0)
    probs = np.sort(rng.dirichlet(np.ones(50), size=rows)[:, :k], axis=1)[:, ::-1].astype(np.float32)
    ids = np.tile(np.arange(k, dtype=np.int64), (rows, 1))
    return LogitLens(position=0, token="x", top_ids=ids, top_probs=np.ascontiguousarray(probs),
                     top_strings=tuple(tuple(f" w{j}" for j in range(k)) for _ in range(rows)), final_id=0,
                     final_string=" w0", final_probs=np.ascontiguousarray(probs[:, 0]),
                     final_ranks=np.ones(rows, dtype=np.int64))


@pytest.mark.parametrize("rows", [3, 31, 81])
def test_the_lens_figure_has_one_row_per_layer_and_stays_under_1000_px(rows):
    from attention_explorer.prediction_figures import logit_lens_figure

    fig = logit_lens_figure(_fake_lens(rows))
    heat = fig.data[0]
    assert len(heat.y) == rows and list(heat.x) == [f"rank {j}" for j in range(1, 6)]
    assert heat.text[0][0] == "␣w0"  # the token's leading space is visible
    assert fig.layout.height <= 1000
    outlined = [(shape.x0 + 0.5, shape.y0 + 0.5) for shape in fig.layout.shapes]
    assert outlined == [(0, i) for i in range(rows)]  # every row's rank-1 cell holds the final prediction


def test_the_final_prediction_figure_follows_its_probability_through_the_layers():
    from attention_explorer.prediction_figures import final_prediction_figure

    lens = _fake_lens(31)
    fig = final_prediction_figure(lens)
    np.testing.assert_allclose(np.asarray(fig.data[0].y), lens.final_probs, rtol=1e-6)
    assert fig.layout.yaxis.type == "log" and fig.layout.height <= 1000


def test_the_prediction_table_has_one_row_per_position_shaded_by_probability(decoder_traces):
    from attention_explorer.prediction_figures import prediction_table, shown_text

    _, trace = decoder_traces["phi3"]
    styler = prediction_table(trace, 5)
    frame = styler.data
    assert len(frame) == trace.n_tokens
    assert list(frame.columns) == ["pos", "token", "next in text", "its rank", "1st", "2nd", "3rd", "4th", "5th"]
    assert frame["1st"][0].startswith(shown_text(trace.next_token_strings[0][0]))
    assert frame["next in text"].iloc[-1] == "—"
    css = styler.to_html().split("</style>")[0]  # one rule lists every cell it shades
    assert len(re.findall(r"_row\d+_col[4-8]\b", css)) == trace.n_tokens * 5
    assert not re.findall(r"_row\d+_col[0-3]\b", css)  # position, token, next and rank stay plain


def test_shown_text_makes_whitespace_visible():
    from attention_explorer.prediction_figures import shown_text

    assert shown_text(" Paris") == "␣Paris" and shown_text("\n") == "↵" and shown_text("") == "∅"


# -- the page ------------------------------------------------------------------------------------------------

def _page(query: dict[str, str] | None = None, state: dict | None = None):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
    for key, value in (query or {}).items():
        at.query_params[key] = value
    for key, value in (state or {}).items():
        at.session_state[key] = value
    at.run()
    return _rerun_on(at, "pages/predictions.py")


def _rerun_on(at, page: str | None = None):
    """One run through app.py (tests/test_pages.py says why the stored context goes first)."""
    if page:
        at.switch_page(page)
    if "_app_context" in at.session_state:
        del at.session_state["_app_context"]
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error and not at.sidebar.error, [e.value for e in (*at.error, *at.sidebar.error)]
    return at


def _lens_spec(at) -> dict:
    return json.loads(at.get("plotly_chart")[0].proto.spec)


@pytest.mark.slow
def test_page_shows_a_tiny_decoders_predictions_and_its_lens_with_one_model_copy(tiny_decoders, monkeypatch):
    import ui.loaders

    folder = str(tiny_decoders["llama"])
    loads = []
    real = ui.loaders.load_pretrained_uncached
    monkeypatch.setattr(ui.loaders, "load_pretrained_uncached", lambda *a, **kw: loads.append(a) or real(*a, **kw))
    ui.loaders.get_pretrained.clear()
    at = _page(query={"model": "pretrained", "model_id": folder})
    trace = at.session_state["_app_context"].trace
    assert [t.value for t in at.title] == ["What the model predicts"]
    assert len(at.dataframe) == 1 and len(at.dataframe[0].value) == trace.n_tokens
    assert len(at.get("plotly_chart")) == 2
    assert at.selectbox(key="pred_position").value == trace.n_tokens - 1  # the last token by default
    spec = _lens_spec(at)
    assert spec["data"][0]["y"] == ["embeddings", "layer 0", "layer 1"]
    assert [b.label for b in at.get("download_button")][:2] == [
        "Next-token predictions (CSV, top 10 at every position)", f"Logit lens at position {trace.n_tokens - 1} (CSV)"]
    assert len(loads) == 1, loads  # the page's lens used the trace's cached model, not a second copy

    at.selectbox(key="pred_position").set_value(2)
    _rerun_on(at)
    assert at.selectbox(key="pred_position").value == 2
    assert "(position 2)" in " ".join(c.value for c in at.caption)
    assert len(loads) == 1


@pytest.mark.slow
@pytest.mark.parametrize("state", [{}, {"ctl_model": "custom", "ctl_num_hidden_layers": 2, "ctl_num_attention_heads": 2, "ctl_hidden_size": 32}],
                         ids=["bert", "custom"])
def test_page_says_plainly_that_an_encoder_predicts_no_next_tokens(state):
    at = _page(state=state)
    assert [t.value for t in at.title] == ["What the model predicts"]
    assert any("do not predict next tokens" in i.value for i in at.info), [i.value for i in at.info]
    assert not at.get("plotly_chart") and not at.dataframe
    assert [b.label for b in at.main.button] == ["Use SmolLM2-135M-Instruct"]


@pytest.mark.slow
def test_the_encoder_messages_button_switches_to_the_bundled_decoder():
    from model_core.settings import BUNDLED_DECODER_ID

    at = _page()
    at.main.button[0].click()
    _rerun_on(at)
    assert at.session_state["ctl_model_id"] == BUNDLED_DECODER_ID
    trace = at.session_state["_app_context"].trace
    assert trace.is_decoder and trace.n_layers == 30
    assert len(at.get("plotly_chart")) == 2
    assert len(_lens_spec(at)["data"][0]["y"]) == 31
    assert at.query_params["model_id"] == BUNDLED_DECODER_ID
