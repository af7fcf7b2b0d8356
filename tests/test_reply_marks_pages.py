"""A generated sequence opened by its link (token_ids, reply_start) marks where the reply starts on the token axes of
the heatmaps, causal and rollout pages (a dashed teal line and a "reply ▸" label); a typed-in text has no mark."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from app_runs import run_app

from attention_explorer.reply_marks import REPLY_COLOR
from model_core.generate.generation import DecodingOptions, generate
from model_core.models.loading import load_pretrained

PROMPT = "time flies like an arrow"
PAGES = ("pages/heatmaps.py", "pages/causal.py", "pages/analysis_rollout.py")


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    from tiny_models import build_tiny_decoder

    return build_tiny_decoder("llama", tmp_path_factory.mktemp("reply-marks") / "llama")


@pytest.fixture(scope="module")
def generation(llama):
    return generate(load_pretrained(str(llama), device="cpu"), PROMPT, options=DecodingOptions(max_new_tokens=5))


def _marks(spec: dict) -> tuple[list[dict], list[dict]]:
    """The reply's lines and labels in one figure's JSON."""
    layout = spec.get("layout", {})
    lines = [s for s in layout.get("shapes", []) if s.get("line", {}).get("color") == REPLY_COLOR]
    labels = [a for a in layout.get("annotations", []) if a.get("text", "").startswith("reply")]
    return lines, labels


def _open(query: dict, page: str, **state):
    """The app opened on ``query`` with ``state``, on ``page``."""
    at = run_app(state, query)
    at.switch_page(page)
    del at.session_state["_app_context"]  # a fresh run through app.py, as a click on the page does
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def _charts(query: dict, page: str, **state) -> list[dict]:
    """Every chart ``page`` draws for the app opened on ``query``, as Plotly JSON."""
    return [json.loads(chart.proto.spec) for chart in _open(query, page, **state).get("plotly_chart")]


def _link(folder: Path, generation) -> dict:
    return {"model": "pretrained", "model_id": str(folder), "text_a": generation.text, "text_b": "",
            "token_ids": ",".join(map(str, generation.token_ids.tolist())),
            "reply_start": str(generation.reply_start)}


def _vertical(spec: dict) -> list[float]:
    """Where the figure's vertical reply lines stand (data coordinates)."""
    return [s["x0"] for s in _marks(spec)[0] if s.get("x0") == s.get("x1")]


def test_each_page_marks_the_reply_on_its_token_axes_and_a_typed_text_has_no_mark(llama, generation):
    start = generation.reply_start
    assert 0 < start < len(generation.token_ids)
    linked = _link(llama, generation)
    typed = {"model": "pretrained", "model_id": str(llama), "text_a": PROMPT, "text_b": ""}
    for page in PAGES:
        specs = _charts(linked, page)
        marked = [spec for spec in specs if _marks(spec)[0]]
        assert marked, f"{page}: no chart marks the reply"
        for spec in marked:
            lines, labels = _marks(spec)
            assert labels, f"{page}: a reply line without its label"
            # Square token x token heatmaps: one vertical and one horizontal line, just before the reply's first row.
            assert _vertical(spec) and all(x == start - 0.5 for x in _vertical(spec)), (page, lines)
        assert not any(_marks(spec)[0] or _marks(spec)[1] for spec in _charts(typed, page)), page


def test_with_words_on_the_mark_stands_before_the_word_that_holds_the_reply(llama, generation):
    at = _open(_link(llama, generation), "pages/heatmaps.py", ctl_words=True)
    ctx = at.session_state["_app_context"]
    assert ctx.words is not None
    word = ctx.words.word_of(generation.reply_start)
    assert ctx.reply_start() == word != generation.reply_start  # a word index, not the piece's
    focus = [spec for spec in (json.loads(c.proto.spec) for c in at.get("plotly_chart")) if _vertical(spec)]
    assert focus and all(x == word - 0.5 for spec in focus for x in _vertical(spec))


LONG = ("The river rose in the night. The valley waited for the morning!\nChildren counted the stones on the bank. "
        "Herons stood in the shallows below the weir.\n")


def test_a_long_generated_sequence_is_marked_on_its_compact_views(llama, monkeypatch):
    monkeypatch.setenv("AE_FULL_TRACE_MB", "0.2")  # past about 79 tokens a tiny decoder's trace is compact
    long = generate(load_pretrained(str(llama), device="cpu"), LONG, options=DecodingOptions(max_new_tokens=4))
    at = _open(_link(llama, long), "pages/heatmaps.py")
    compact = at.session_state["_app_context"].compact
    assert compact is not None and compact.reply_start == long.reply_start
    specs = {c.proto.id: json.loads(c.proto.spec) for c in at.get("plotly_chart")}
    titles = {key: spec.get("layout", {}).get("title", {}).get("text", "") for key, spec in specs.items()}
    marked = {titles[key] for key, spec in specs.items() if _vertical(spec)}
    # The pooled head and the sink line read positions; the window "position: token" categories (its own index).
    assert any(t.startswith("Pooled") for t in marked) and any(t.startswith("Weight on the first") for t in marked)
    assert any(t.startswith("Queries") for t in marked), titles
    for key, spec in specs.items():
        if titles[key].startswith(("Pooled", "Weight on the first")):
            assert _vertical(spec) == [long.reply_start - 0.5]
    # The causal page's panels are one window of the last n // 2 tokens, counted from the window's first.
    lo = compact.n_tokens - min(64, compact.n_tokens // 2)
    causal = [spec for spec in _charts(_link(llama, long), "pages/causal.py") if _vertical(spec)]
    assert causal and all(_vertical(spec) == [long.reply_start - lo - 0.5] for spec in causal)
