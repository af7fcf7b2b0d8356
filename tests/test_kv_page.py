"""The KV cache page through Streamlit's AppTest: a tiny decoder's kept keys, retained grid, cost, sweep and CSVs;
an encoder's explanation; a ratio outside (0, 1); and (slow) SmolLM2 at 128 and 512 tokens plus the needle test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from app_runs import open_page, plotly_z
from streamlit.testing.v1 import AppTest
from tiny_models import CORPUS

from model_core.settings import BUNDLED_DECODER_ID

PAGE = "pages/kv_cache.py"


def _open(query: dict, **state) -> AppTest:
    """The app with ``query`` in its link, switched to the KV cache page, after one run of it."""
    return open_page(PAGE, query, state, timeout=300)


def _charts(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def test_page_shows_kept_keys_retained_and_cost_on_a_tiny_decoder(tiny_decoders):
    folder = str(tiny_decoders["llama"])
    at = _open({"model": "pretrained", "model_id": folder, "a": CORPUS[:290]}, pg_press="streaming_llm",
               pg_ratio=0.75)
    assert at.title[0].value == "KV cache"
    assert not at.error, [e.value for e in at.error]
    n = at.session_state["_app_context"].trace.n_tokens
    kept = int((n - 1) * 0.25)
    assert at.metric[0].value == f"{kept} of {n - 1}"
    assert at.metric[1].value.endswith("nats")
    charts = _charts(at)
    kept_image = plotly_z(charts[0]["data"][0])  # key/value head 0: layer x position
    assert kept_image.shape == (2, n - 1)
    assert (kept_image.sum(1) == kept).all()
    assert (kept_image[:, :4] == 1).all() and (kept_image[:, -(kept - 4):] == 1).all()  # sinks + recent window
    retained = plotly_z(charts[1]["data"][0])
    assert retained.shape == (2, 4) and ((retained > 0) & (retained < 1)).all()
    labels = [b.label for b in at.get("download_button")]
    assert any("Kept positions" in label for label in labels) and any("Retained" in label for label in labels)


def test_sweep_button_draws_one_line_per_policy(tiny_decoders):
    folder = str(tiny_decoders["gpt2"])
    at = _open({"model": "pretrained", "model_id": folder, "a": CORPUS[:200]})
    at.button(key="kv_run_sweep").click().run()
    assert not at.exception, [e.value for e in at.exception]
    sweep = [c for c in _charts(at) if "Budget sweep" in json.dumps(c["layout"].get("title", ""))]
    assert len(sweep) == 1 and len(sweep[0]["data"]) == 5
    assert all(len(line["x"]) == 9 for line in sweep[0]["data"])


def test_an_encoder_is_explained_with_a_button_to_the_decoder():
    at = _open({"a": "time flies like an arrow"})
    assert any("no KV cache" in i.value for i in at.info)
    assert any(b.label == "Use SmolLM2-135M-Instruct" for b in at.button)


@pytest.mark.parametrize("ratio", [0.0, 1.0])
def test_a_ratio_outside_zero_one_says_so(tiny_decoders, ratio):
    at = _open({"model": "pretrained", "model_id": str(tiny_decoders["llama"]), "a": CORPUS[:200]}, pg_ratio=ratio)
    assert any("strictly between 0 and 1" in e.value for e in at.error)
    assert not at.get("plotly_chart")


@pytest.mark.slow
@pytest.mark.parametrize("n_words", [100, 400])
def test_smollm2_page_at_128_and_512_tokens(n_words):
    from model_core.generate.needle import HAYSTACK

    text = " ".join(HAYSTACK.split()[:n_words])
    at = _open({"model": "pretrained", "model_id": BUNDLED_DECODER_ID, "a": text}, pg_press="snapkv", pg_ratio=0.5)
    assert not at.error, [e.value for e in at.error]
    n = at.session_state["_app_context"].trace.n_tokens
    assert 100 < n < 600
    charts = _charts(at)
    assert len(charts[0]["data"]) == 3  # three key/value heads stacked
    assert plotly_z(charts[1]["data"][0]).shape == (30, 9)


def test_the_needle_test_says_when_the_model_is_too_short(tiny_decoders):
    at = _open({"model": "pretrained", "model_id": str(tiny_decoders["llama"]), "a": CORPUS[:200]})
    at.button(key="kv_run_needle").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("positions allow 128" in e.value for e in at.error)


@pytest.mark.slow
def test_smollm2_needle_snapkv_keeps_the_answer_streaming_loses_it():
    from model_core.generate.needle import needle_test
    from model_core.models.loading import load_pretrained

    loaded = load_pretrained(BUNDLED_DECODER_ID)
    result = needle_test(loaded.family, loaded.model, loaded.tokenizer, ("streaming_llm", "snapkv"), (0.3, 0.9))
    assert result.full_passed, result.full_answer
    assert not result.passed[0, 1], result.answers  # StreamingLLM at 0.9 drops the fact in the middle
    assert result.passed[1, 0], result.answers  # SnapKV at 0.3 keeps it


@pytest.mark.slow
def test_smollm2_page_at_about_4000_tokens_reads_the_compact_trace():
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from bench_compact import long_text

    at = _open({"model": "pretrained", "model_id": BUNDLED_DECODER_ID, "a": long_text(2900)}, pg_press="tova",
               pg_ratio=0.9)
    assert not at.error, [e.value for e in at.error]
    ctx = at.session_state["_app_context"]
    assert ctx.compact is not None and 3500 < ctx.compact.n_tokens <= 4096
    n = ctx.compact.n_tokens
    kept = plotly_z(_charts(at)[0]["data"][0])
    assert kept.shape == (30, n - 1) and (kept.sum(1) == int((n - 1) * (1 - 0.9))).all()
    assert (kept[:, -1] == 1).all()  # TOVA always keeps the last prefill key
