"""What the Generate page and the notebook draw: the attention of the query that wrote a reply token (full and compact
alike), that attention on the text as escaped HTML, the reply's start on every token figure, and ae-style generate."""

from __future__ import annotations

import numpy as np
import pytest

from attention_explorer.figures import attention_heatmap, selection_grid, token_norms_figure, vector_heatmap
from attention_explorer.generation import attention_text_html
from attention_explorer.generation import generate as notebook_generate
from attention_explorer.reply_marks import REPLY_COLOR
from model_core.generate.reading import writing_attention
from ui.compact_figures import first_token_figure, pooled_head_figure, window_figure

PROMPT = "time flies like an arrow"


@pytest.fixture(scope="module")
def generated(tiny_decoders):
    return notebook_generate(PROMPT, chat=False, max_new_tokens=5, model=str(tiny_decoders["llama"]), device="cpu")


def test_the_notebook_generate_returns_a_trace_that_knows_where_the_reply_starts(generated):
    g = generated
    assert g.reply_start == len(g.generation.prompt_ids) == g.core.reply_start
    assert g.core.token_ids.tolist() == g.generation.token_ids.tolist()
    assert g.reply_pieces == list(g.generation.tokens)
    table = g.candidates(0)
    assert table["written"].iloc[0] and table["probability"].is_monotonic_decreasing
    assert "outline" in g.attention_on_text(-1, "layer", layer=1)._repr_html_()


def test_the_writing_query_is_the_one_before_the_written_token(generated):
    t = generated.core
    p = generated.reply_start + 2
    np.testing.assert_allclose(writing_attention(t, p, "head", 1, 3), t.weights[1, 3, p - 1, :p])
    np.testing.assert_allclose(writing_attention(t, p, "layer", 1), t.weights[1, :, p - 1, :p].mean(0), atol=1e-6)
    np.testing.assert_allclose(writing_attention(t, p, "all"), t.weights[:, :, p - 1, :p].mean((0, 1)), atol=1e-6)
    assert writing_attention(t, p, "all").sum() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="pick 1-"):
        writing_attention(t, 0)


def test_a_compact_trace_gives_the_same_writing_attention(tiny_decoders):
    from model_core import TraceRequest, build_trace
    from model_core.compact.build import build_compact

    text = PROMPT + " and fruit flies like a banana"
    request = TraceRequest("pretrained", text, model_id=str(tiny_decoders["qwen2"]))
    full, compact = build_trace(request, device="cpu"), build_compact(request, device="cpu")
    for p in (3, full.n_tokens - 1):
        for how in ("head", "layer", "all"):
            np.testing.assert_allclose(writing_attention(compact, p, how, 1, 2), writing_attention(full, p, how, 1, 2),
                                       atol=1e-5)


def test_the_text_view_escapes_every_token_and_shades_by_weight():
    texts = ["<script>", " a", "&b", "\n", " c"]
    html = attention_text_html(texts, np.array([0.5, 0.25, 0.25]), written=3, reply_start=3)
    assert "<script>" not in html and "&lt;script&gt;" in html and "&amp;b" in html
    assert "rgba(33,102,172,1.000)" in html and "rgba(33,102,172,0.500)" in html
    assert html.index("▸") < html.index("outline") and "written later" in html


def _reply_shapes(fig) -> list:
    return [s for s in fig.layout.shapes if s.line.color == REPLY_COLOR]


def test_the_reply_start_is_drawn_on_every_token_figure():
    tokens = tuple("abcdefgh")
    square = attention_heatmap(np.eye(8), tokens, reply_start=5)
    assert [(s.x0, s.y0) for s in _reply_shapes(square)] == [(4.5, -0.5), (-0.5, 4.5)]
    hidden = attention_heatmap(np.eye(8), tokens, reply_start=5, hide=[0])  # one position fewer before it
    assert _reply_shapes(hidden)[0].x0 == 3.5
    assert not _reply_shapes(attention_heatmap(np.eye(8), tokens))
    window = window_figure(np.zeros((3, 2)), tokens, (4, 7), (0, 2), np.zeros((3, 2), bool), "w", reply_start=5)
    assert [(s.y0, s.y1) for s in _reply_shapes(window)] == [(0.5, 0.5)]  # rows 4-6: the line before row 5
    assert len(_reply_shapes(pooled_head_figure(np.eye(3), 3, tokens, "p", reply_start=5))) == 2
    assert len(_reply_shapes(first_token_figure(np.ones(8), "f", reply_start=5))) == 1
    assert len(_reply_shapes(vector_heatmap(np.ones((8, 4)), tokens, title="v", reply_start=5))) == 1
    assert len(_reply_shapes(token_norms_figure(tokens, {"x": np.ones(8)}, "n", reply_start=5))) == 1
    assert len(_reply_shapes(selection_grid(np.ones((2, 2, 8)), tokens, title="s", value_name="w",
                                            reply_start=5))) == 1
