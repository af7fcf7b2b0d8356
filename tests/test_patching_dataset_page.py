"""The patching page's dataset mode (AppTest): an uploaded JSONL on a tiny Llama-like decoder runs mean patching and
shows the mean-effect grid with the spread on hover and the problems; a file that is not JSONL or CSV, or a generator
whose pairs this tokenizer cannot read, gets a message and the page keeps working; a stopped run shows its pairs."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest
from tiny_models import build_tiny_decoder

from harness.apptest import open_page

PAGE = "pages/patching.py"
PAIRS = [{"clean": "The cat sat on the mat", "corrupt": "The bank sat on the mat", "answer": " cat", "foil": " bank"},
         {"clean": "The cat sat on the mat", "corrupt": "The dog sat on the mat", "answer": " cat", "foil": " bank"},
         {"clean": "The bank sat on the mat", "corrupt": "The cat sat on the mat", "answer": " bank", "foil": " cat"}]
JSONL = "\n".join(json.dumps(p) for p in PAIRS).encode()


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return build_tiny_decoder("llama", tmp_path_factory.mktemp("patch-ds-page") / "llama")


def _open(model_id: str, **state) -> AppTest:
    """app.py on ``model_id``, then the patching page in dataset mode, with ``state`` set first."""
    return open_page(PAGE, "Activation patching", model_id=model_id, state={"patch_mode": "dataset", **state})


def _upload(at: AppTest, name: str, content: bytes) -> AppTest:
    at.file_uploader(key="patch_ds_upload").set_value((name, content, "application/octet-stream")).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _array(value) -> np.ndarray:
    """A figure's array from its JSON: a list, or plotly's typed array {"dtype", "bdata" (base64), "shape"}."""
    if isinstance(value, dict):
        flat = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        return flat.reshape([int(n) for n in str(value.get("shape", len(flat))).split(",")])
    return np.array(value, dtype=float)


def _charts(at: AppTest) -> dict[str, dict]:
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    return {s.get("layout", {}).get("title", {}).get("text", ""): s for s in specs}


def test_an_uploaded_dataset_runs_and_shows_the_mean_with_its_spread(llama):
    at = _upload(_open(str(llama), patch_ds_source="upload"), "pairs.jsonl", JSONL)
    assert any("3 pairs, 2 valid; 8 tokens each" in c.value for c in at.caption)
    assert "1 pair cannot run" in at.warning[0].value
    assert "pair 2 (row 2): the clean prompt is 8 tokens and the corrupted prompt 9" in at.code[0].value
    assert not _charts(at)  # nothing runs before the Run button
    at.button(key="patch_ds_run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    charts = _charts(at)
    heads = charts["Mean effect over 2 pairs (hover: spread)"]["data"][0]
    assert "std over the pairs" in heads["hovertemplate"]
    spread = _array(heads["customdata"])
    assert spread.shape == (2, 4) and spread.max() > 0 and (spread >= 0).all()
    assert "Mean patching of resid_pre" in charts
    assert [m.label for m in at.metric] == ["Pairs run", "Mean clean metric", "Mean corrupted metric"]
    assert at.metric[0].value == "2"
    assert "pair 2 (row 2)" in at.code[0].value  # the problems stay listed beside the result
    assert {"Mean effect per head (CSV)", "Spread per head (CSV)", "Mean residual grid (CSV)"} <= {
        b.label for b in at.get("download_button")}


def test_pairs_of_different_lengths_leave_the_residual_stream_out(llama):
    short = {"clean": "The cat sat", "corrupt": "The bank sat", "answer": " cat", "foil": " bank"}
    content = "\n".join(json.dumps(p) for p in [PAIRS[0], short]).encode()
    at = _upload(_open(str(llama), patch_ds_source="upload"), "pairs.jsonl", content)
    at.button(key="patch_ds_run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert "Mean effect over 2 pairs (hover: spread)" in _charts(at)
    assert "Mean patching of resid_pre" not in _charts(at)
    assert "residual stream is left out: the pairs have 5 to 8 tokens" in at.info[0].value


@pytest.mark.parametrize("name, content, expected", [
    ("notes.txt", b"some prose, not pairs\nmore prose", "neither JSONL"),
    ("pairs.csv", b"clean,corrupt\na,b\n", "lacks answer, foil"),
    ("pairs.jsonl", b"", "empty"),
])
def test_a_file_that_cannot_be_read_gets_a_message_and_the_page_keeps_working(llama, name, content, expected):
    pair = {"pg_clean": "The cat sat on the mat", "pg_corrupt": "The bank sat on the mat", "pg_patch_answer": " cat",
            "pg_patch_foil": " bank"}
    at = _upload(_open(str(llama), patch_ds_source="upload", **pair), name, content)
    assert expected in at.error[0].value
    assert not _charts(at)
    at.radio(key="patch_mode").set_value("pair").run()  # the single-pair mode is there as before
    assert not at.exception, [e.value for e in at.exception]
    assert [m.label for m in at.metric][:2] == ["Clean metric", "Corrupted metric"]


def test_a_generator_this_tokenizer_cannot_read_lists_every_pair(llama):
    at = _open(str(llama), patch_ds_generator="ioi", patch_ds_count=3)
    assert "No pair of ioi:3:0 can run" in at.error[0].value
    assert at.code[0].value.count("pair ") == 3 and "pair 1 (row 1)" in at.code[0].value
    assert "patch_ds_run" not in [b.key for b in at.button]


def test_a_stopped_run_shows_the_pairs_finished_and_can_run_again(llama):
    from model_core.circuits.mean_patching import MeanPatching
    from model_core.trace.request import TraceRequest
    from ui.patching import model_request
    from ui.patching_dataset import RESULT_KEY

    model = model_request(TraceRequest("pretrained", "x", model_id=str(llama)))
    key = (model, ("upload", "pairs.jsonl", hashlib.sha256(JSONL).hexdigest()))
    heads = np.full((2, 4), 0.25)
    partial = MeanPatching(1, heads, np.zeros((2, 4)), None, ("pair 2 (row 2): too long",), 1.0, -1.0, partial=True,
                           to_run=2)
    at = _open(str(llama), patch_ds_source="upload")
    at.session_state[RESULT_KEY] = (key, partial)
    _upload(at, "pairs.jsonl", JSONL)
    assert "1 of 2 pairs are averaged" in at.warning[0].value
    assert at.metric[0].value == "1 of 2"
    assert "Mean effect over 1 pairs (hover: spread)" in _charts(at)
    assert at.button(key="patch_ds_run").label == "Run mean patching (2 pairs)"


@pytest.mark.slow
def test_the_bundled_smollm2_with_a_generator():
    from model_core.settings import BUNDLED_DECODER_ID

    at = _open(BUNDLED_DECODER_ID, patch_ds_generator="facts", patch_ds_count=2)
    assert any("2 pairs, 2 valid; 6 tokens each" in c.value for c in at.caption)
    at.button(key="patch_ds_run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert "Mean effect over 2 pairs (hover: spread)" in _charts(at)
    assert float(at.metric[1].value) > 0 > float(at.metric[2].value)


def test_a_50000_row_file_runs_its_first_pairs_and_says_how_long(llama):
    """A hostile upload (50,000 rows, about 5 MB): the page keeps the first AE_MAX_PAIRS, says so and how long the
    run will take, and the Run button names that many pairs."""
    big = "\n".join([json.dumps(PAIRS[0])] * 50_000).encode()
    at = _upload(_open(str(llama), patch_ds_source="upload"), "many.jsonl", big)
    infos = [i.value for i in at.info]
    assert any("has 50,000 rows; this page runs the first 256" in i for i in infos), infos
    assert any(c.value.startswith("The run will take about") for c in at.caption), [c.value for c in at.caption]
    assert at.button(key="patch_ds_run").label == "Run mean patching (256 pairs)"


def test_a_dataset_over_the_memory_limit_is_refused_before_run(llama, monkeypatch):
    monkeypatch.setenv("AE_RUN_MEMORY_MB", "1")
    at = _upload(_open(str(llama), patch_ds_source="upload"), "pairs.jsonl", JSONL)
    errors = [e.value for e in at.error]
    assert any("Activation patching of two prompts" in e and "would need about" in e and "limit of 1 MB" in e
               for e in errors), errors
    assert "patch_ds_run" not in [b.key for b in at.button]
