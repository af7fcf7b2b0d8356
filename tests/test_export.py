"""The export command: round trip through .npz and .json, and one-line errors."""

import json
import subprocess
import sys

import numpy as np
import pytest

from harness.cli import run_cli
from model_core.io.export import EXPORT_KEYS, trace_arrays, write_trace
from model_core import TraceRequest, build_trace


def test_npz_round_trip(tmp_path, bert_pair_trace):
    path = write_trace(bert_pair_trace, tmp_path / "t.npz")
    data = np.load(path)
    assert set(data.files) == set(EXPORT_KEYS)
    assert list(data["tokens"]) == list(bert_pair_trace.tokens)
    np.testing.assert_array_equal(data["attentions"], bert_pair_trace.weights)
    for key in ("attentions", "scores", "masked_scores", "mask", "hidden_states", "queries", "keys"):
        assert data[key].dtype == np.float32
    assert data["scores"].shape == (6, 12, 13, 13) and data["mask"].shape == (13, 13)


def test_json_round_trip_writes_minus_inf_as_null(tmp_path):
    trace = build_trace(TraceRequest("custom", "a b c", causal=True, num_hidden_layers=1, num_attention_heads=2, hidden_size=8))
    data = json.loads(write_trace(trace, tmp_path / "t.json").read_text())
    assert data["masked_scores"][0][0][0][1] is None
    np.testing.assert_allclose(np.array(data["attentions"], dtype=np.float32), trace.weights, atol=1e-6)
    assert data["tokens"] == list(trace.tokens)


def test_bad_suffix(tmp_path, bert_pair_trace):
    with pytest.raises(ValueError, match=".npz or .json"):
        write_trace(bert_pair_trace, tmp_path / "t.csv")


def _cli(*args):
    """The verb through a real process (``python -m model_core``)."""
    return subprocess.run([sys.executable, "-m", "model_core", "export", *args], capture_output=True, text=True,
                          timeout=180)


@pytest.mark.slow
def test_cli_writes_npz(tmp_path):
    out = tmp_path / "x.npz"
    r = _cli("--model", "custom", "--weights", "pretrained", "--causal", "--text", "time flies", "--text-b",
             "fruit flies", "--out", str(out))
    assert r.returncode == 0, r.stderr
    data = np.load(out)
    assert data["attentions"].shape == (6, 12, 7, 7)
    assert np.isneginf(data["masked_scores"][0, 0, 0, 1])


def _here(*args):
    """The verb in this process (``harness.cli``): the tests of its options and messages."""
    return run_cli("export", *args, env={"HF_HUB_OFFLINE": "1"})


def test_cli_builds_the_custom_encoder_shape_it_is_given(tmp_path):
    out = tmp_path / "x.npz"
    r = _here("--model", "custom", "--layers", "2", "--heads", "2", "--hidden", "32", "--norm", "post", "--seed", "3",
             "--text", "time flies", "--out", str(out))
    assert r.returncode == 0, r.stderr
    data = np.load(out)
    assert data["attentions"].shape == (2, 2, 4, 4) and data["queries"].shape[-1] == 16
    bad = _here("--model", "custom", "--heads", "5", "--hidden", "32", "--text", "hi", "--out", str(out))
    assert bad.returncode != 0 and "Traceback" not in bad.stderr and bad.stderr.startswith("error:")


@pytest.mark.parametrize("args,needle", [
    (["--model", "bert", "--text", "   ", "--out", "x.npz"], "empty"),
    (["--model", "bert", "--model-id", "../x", "--text", "hi", "--out", "x.npz"], ".."),
    (["--model", "bert", "--text", "hi", "--out", "x.txt"], ".npz or .json"),
])
def test_cli_bad_input_is_one_line(tmp_path, monkeypatch, args, needle):
    monkeypatch.chdir(tmp_path)  # where a relative --out would go
    r = _here(*args)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    assert needle in r.stderr
    assert len([line for line in r.stderr.splitlines() if line.startswith("error:")]) == 1


def test_trace_arrays_masks_are_float(bert_pair_trace):
    assert trace_arrays(bert_pair_trace)["mask"].dtype == np.float32


def test_csv_labels_carry_each_tokens_position_when_specials_are_hidden():
    """The heatmap shows "1: time" with [CLS] hidden; its CSV must say 1:time, not 0:time."""
    from model_core.io.tables import token_matrix_to_csv

    tokens = ["[CLS]", "time", "flies", "[SEP]"]
    keep = [1, 2]
    matrix = np.arange(16, dtype=np.float32).reshape(4, 4)
    text = token_matrix_to_csv(matrix[np.ix_(keep, keep)], [tokens[i] for i in keep], [tokens[i] for i in keep],
                         row_positions=keep, col_positions=keep)
    header, first, second = text.strip().splitlines()
    assert header.split(",")[1:] == ["1:time", "2:flies"]
    assert header.split(",")[0] == "query \\ key"
    assert first.split(",") == ["1:time", "5.0", "6.0"] and second.startswith("2:flies,9.0,10.0")
    with pytest.raises(ValueError, match="one position per label"):
        token_matrix_to_csv(matrix, tokens, tokens, row_positions=[0])
