"""The notebook's direct logit attribution (attention_explorer.attribution) and its figures, on a tiny GPT-2."""

from __future__ import annotations

import numpy as np
import pytest
from tiny_models import build_tiny_decoder

from attention_explorer.attribution import attribute, heads_figure, parts_figure, sources_bars, sources_html
from model_core.effects.attribution import NotOneToken

TEXT = "time flies like an arrow"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny_decoder("gpt2", tmp_path_factory.mktemp("dla-nb") / "gpt2")


@pytest.fixture(scope="module")
def tiny(folder):
    from model_core.models.loading import load_pretrained_uncached
    from model_core.trace.forward import trace_pretrained

    loaded = load_pretrained_uncached(str(folder), device="cpu")
    return loaded, trace_pretrained(loaded, loaded.family.encode(loaded.tokenizer, TEXT, max_tokens=64))


def test_the_notebook_loads_a_model_by_its_id(tiny, folder):
    loaded, trace = tiny
    by_id = attribute(trace, str(folder), answer=" banana", device="cpu").attribution
    np.testing.assert_allclose(by_id.heads, attribute(trace, loaded, answer=" banana").attribution.heads, atol=1e-6)


def test_the_notebook_defaults_to_the_top_prediction_and_the_runner_up(tiny):
    loaded, trace = tiny
    top, second = (int(i) for i in trace.next_token_ids[-1, :2])
    dla = attribute(trace, loaded)
    assert (dla.attribution.answer_id, dla.attribution.foil_id) == (top, second) and "−" in dla.label
    assert dla.text == tuple(loaded.tokenizer.decode([int(i)]) for i in trace.token_ids)
    assert attribute(trace, loaded, answer=second).attribution.foil_id == top  # the answer is the runner-up
    for none in (attribute(trace, loaded, foil=False), attribute(trace, loaded, no_foil=True)):
        assert none.attribution.foil_id is None
        assert none.label.startswith("logit(") and "−" not in none.label
    with pytest.raises(ValueError, match="opposite"):
        attribute(trace, loaded, foil=" flies", no_foil=True)


def test_the_notebook_takes_tokens_as_written(tiny):
    loaded, trace = tiny
    dla = attribute(trace, loaded, answer=" banana", foil=" flies")
    ids = [loaded.tokenizer.convert_tokens_to_ids(t) for t in ("Ġbanana", "Ġflies")]
    assert [dla.attribution.answer_id, dla.attribution.foil_id] == ids
    assert dla.attribution.total == pytest.approx(dla.attribution.logit, abs=1e-5)
    with pytest.raises(NotOneToken):
        attribute(trace, loaded, answer=" xylophonequ")


def test_figures_show_the_numbers(tiny):
    loaded, trace = tiny
    dla = attribute(trace, loaded)
    grid = dla.heads_figure
    np.testing.assert_array_equal(grid.data[0].z, dla.attribution.heads)
    assert grid.data[0].zmin == -grid.data[0].zmax  # a diverging scale centred at 0
    assert grid.data[0].zmax == pytest.approx(np.abs(dla.attribution.heads).max())
    parts = parts_figure(dla.attribution).data[0]
    assert list(parts.x[:2]) == ["embed", "MLP 0"] and parts.x[-1] == "rest"
    assert sum(parts.y) == pytest.approx(dla.attribution.total, abs=1e-9)  # "all heads" is one of the bars
    bars = dla.sources_figure(1, 2).data[0]
    np.testing.assert_allclose(bars.y, dla.sources(1, 2))
    assert len(heads_figure(dla.attribution, clickable=True).data) == 2  # the click layer


def test_sources_html_escapes_and_shades_by_sign():
    html = sources_html(np.array([0.5, -1.0, 0.0]), ["<b>", " & ", "\n"], position=2)
    assert "&lt;b&gt;" in html and "&amp;" in html and "<b>" not in html
    assert "rgba(178,24,43,0.500)" in html and "rgba(33,102,172,1.000)" in html
    assert html.count("outline") == 1 and "↵" in html


def test_sources_bars_label_every_token():
    fig = sources_bars(np.array([0.1, -0.2]), ["a", "b"], title="t")
    assert list(fig.data[0].x) == ["0: a", "1: b"]
