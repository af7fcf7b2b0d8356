"""AppTest of the Corpus page: the demo run, reopening without recomputing, run folders and their model."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from model_core.corpus import CorpusModel, RunOptions, demo_corpus, run_corpus

pytestmark = pytest.mark.slow

APP = str(Path(__file__).resolve().parents[1] / "app.py")


def _page(monkeypatch, runs: Path, **state) -> AppTest:
    monkeypatch.setenv("AE_CORPUS_DIR", str(runs))
    at = AppTest.from_file(APP, default_timeout=240)
    for key, value in state.items():
        at.session_state[key] = value
    at.switch_page("pages/corpus.py")
    return at


def _run(at: AppTest) -> AppTest:
    """One run through app.py: AppTest runs a page file alone after its first run (see tests/test_pages.py)."""
    if "_app_context" in at.session_state:
        del at.session_state["_app_context"]
    at.run()
    return at


def _clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def test_demo_corpus_runs_on_open_and_reopens_without_recomputing(tmp_path, monkeypatch):
    at = _page(monkeypatch, tmp_path / "runs")
    at.run()
    _clean(at)
    assert [h.value for h in at.header] == ["Corpus statistics"]
    assert at.metric[0].value == "303"
    assert len(at.get("plotly_chart")) == 2  # the statistic grid and the pattern types
    folders = list((tmp_path / "runs").iterdir())
    assert len(folders) == 1 and (folders[0] / "head_stats.npz").is_file()
    stamp = (folders[0] / "manifest.json").stat().st_mtime_ns
    again = _page(monkeypatch, tmp_path / "runs")
    again.run()
    _clean(again)
    assert any("nothing was recomputed" in c.value for c in again.caption)
    assert (folders[0] / "manifest.json").stat().st_mtime_ns == stamp


def test_every_statistic_and_the_spread_draw(tmp_path, monkeypatch):
    at = _page(monkeypatch, tmp_path / "runs")
    at.run()
    for name in ("to_sep", "a_to_b", "to_prev"):
        at.selectbox(key="corpus_stat").set_value(name)
        _run(at)
        _clean(at)
    at.radio(key="corpus_show").set_value("std")
    _run(at)
    _clean(at)
    assert any("±" in c.value for c in at.caption)


def test_a_run_folder_from_the_cli_opens_and_another_model_is_refused(tmp_path, monkeypatch):
    small = CorpusModel.from_options("custom", num_hidden_layers=2, num_attention_heads=2, hidden_size=32)
    run_corpus(demo_corpus(limit=30), small, tmp_path / "cli_run", options=RunOptions(chunk_size=16), device="cpu")
    at = _page(monkeypatch, tmp_path / "runs", corpus_source="folder", corpus_folder=str(tmp_path / "cli_run"))
    at.run()
    _clean(at)
    assert any("was made with custom encoder" in w.value for w in at.warning)  # the sidebar has the bundled BERT
    at.button(key="corpus_switch").click()
    _run(at)
    _clean(at)
    assert at.session_state["ctl_model"] == "custom" and at.session_state["ctl_num_hidden_layers"] == 2
    assert at.metric[0].value == "30" and not at.warning


def test_a_folder_that_is_not_a_run_says_so(tmp_path, monkeypatch):
    at = _page(monkeypatch, tmp_path / "runs", corpus_source="folder", corpus_folder=str(tmp_path))
    at.run()
    assert not at.exception
    assert any("not a corpus run" in e.value for e in at.error)
