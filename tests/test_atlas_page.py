"""AppTest of the Head atlas page: the demo corpus run from the page (its folder reopens without a run), and an atlas
folder from the CLI with a head in focus, its card's six sections and the escaped contexts."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from model_core.atlas import AtlasOptions, open_atlas, run_atlas
from model_core.corpus import Corpus, CorpusModel

pytestmark = pytest.mark.slow

APP = str(Path(__file__).resolve().parents[1] / "app.py")
SMALL = {"num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 32}
SIDEBAR = {"ctl_model": "custom", "ctl_num_hidden_layers": 2, "ctl_num_attention_heads": 2, "ctl_hidden_size": 32}


def _page(monkeypatch, runs: Path, **state) -> AppTest:
    monkeypatch.setenv("AE_CORPUS_DIR", str(runs))
    at = AppTest.from_file(APP, default_timeout=240)
    for key, value in state.items():
        at.session_state[key] = value
    at.switch_page("pages/head_atlas.py")
    return at


def _clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def test_the_demo_atlas_runs_from_the_page_and_reopens_from_its_folder(tmp_path, monkeypatch):
    at = _page(monkeypatch, tmp_path / "runs", **SIDEBAR)
    at.run()
    _clean(at)
    assert [h.value for h in at.header] == ["Head atlas"]
    at.button(key="atlas_run").click().run()
    _clean(at)
    assert at.subheader[0].value == "Layer 0, head 0"
    assert len(at.get("plotly_chart")) >= 3  # the kinds grid, the scatter, the profile bars
    folders = list((tmp_path / "runs" / "atlas").iterdir())
    assert len(folders) == 1 and (folders[0] / "heads.json").is_file()
    stamp = (folders[0] / "heads.json").stat().st_mtime_ns
    again = _page(monkeypatch, tmp_path / "runs", **SIDEBAR)
    again.run()
    _clean(again)
    assert again.subheader[0].value == "Layer 0, head 0"
    assert (folders[0] / "heads.json").stat().st_mtime_ns == stamp


def _folder_page(tmp_path: Path, monkeypatch, texts: tuple, qk_contexts: int, layer: int, head: int) -> AppTest:
    """The page opened on an atlas folder of ``texts`` (the small chapter-3 encoder) with head (layer, head) focused,
    after its run."""
    run_atlas(Corpus("texts", texts), CorpusModel.from_options("custom", **SMALL), tmp_path / "atlas",
              options=AtlasOptions(chunk_size=4, qk_contexts=qk_contexts), device="cpu")
    at = _page(monkeypatch, tmp_path / "runs", atlas_source="folder", atlas_folder=str(tmp_path / "atlas"),
               sel_layer=layer, sel_head=head, **SIDEBAR)
    at.run()
    _clean(at)
    return at


def test_an_atlas_folder_opens_on_the_focused_head_with_its_text_escaped(tmp_path, monkeypatch):
    texts = tuple((f"<b>bold</b> & text {i} with <script>x</script> words, words.", None) for i in range(8))
    at = _folder_page(tmp_path, monkeypatch, texts, 1, 1, 1)
    assert at.subheader[0].value == "Layer 1, head 1"
    page_html = " ".join(str(e.proto) for e in at.get("html"))
    assert "&lt;" in page_html and "&amp;" in page_html  # the text's own < and &, escaped
    assert "<script" not in page_html and "<b>bold" not in page_html  # the text never becomes markup
    assert any("no unembedding" in i.value for i in at.info)  # an encoder writes no logits: the card says so
    assert len(at.tabs) >= 6
    # the QK split names the contexts it read by their ranks in the list without the sink
    assert any(c.value.startswith("Averaged over its top contexts #1 (keys after the first token") for c in at.caption), \
        [c.value for c in at.caption]


def test_a_head_whose_long_contexts_the_memory_limit_refused_says_why_it_has_no_qk_split(tmp_path, monkeypatch):
    """Every text counts as long for the cards, and the model is one the long card pass does not serve (a stand-in
    for Gemma's out-norm): each context takes ``model_core.qk``'s pass, which the memory limit refuses here."""
    import model_core.atlas.run as atlas_run
    import model_core.atlas.why as why
    from model_core.models.run_memory import RunMemoryError

    def refused(*args, **kwargs):
        raise RunMemoryError("Why this key at 600 tokens needs about 9,000 MB, over the 2,000 MB limit.")

    monkeypatch.setattr(atlas_run, "LONG_FROM", 1)
    monkeypatch.setattr(why, "supported", lambda *a: False)
    monkeypatch.setattr(why, "qk_pass", refused)
    texts = tuple((f"text {i} with some words, and more words.", None) for i in range(4))
    at = _folder_page(tmp_path, monkeypatch, texts, 2, 1, 0)
    assert any("No QK split for this head: its top contexts are in texts of 513 tokens or more, and this model's "
               "split of them would pass the server's memory limit" in i.value for i in at.info), \
        [i.value for i in at.info]


def test_a_server_cap_on_corpus_texts_caps_the_demo_atlas(tmp_path, monkeypatch):
    monkeypatch.setenv("AE_CORPUS_MAX_TEXTS", "12")
    at = _page(monkeypatch, tmp_path / "runs", **SIDEBAR)
    at.run()
    _clean(at)
    assert at.button(key="atlas_run").label == "Run the atlas over 12 texts"
    assert any("the first 12 of its" in c.value and "AE_CORPUS_MAX_TEXTS" in c.value for c in at.caption)
    at.button(key="atlas_run").click().run()
    _clean(at)
    folder = next((tmp_path / "runs" / "atlas").iterdir())
    assert open_atlas(folder).manifest["corpus"]["n_texts"] == 12
