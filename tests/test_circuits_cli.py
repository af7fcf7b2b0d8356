"""The ``circuit`` verb: exactly one JSON object on stdout in the issue's shape (every float at full precision, CPR and
CMD from the printed values), progress and skipped pairs on stderr, and one-line errors with exit 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from model_core.circuits.faithfulness import FRACTIONS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from test_circuits_eap import TINY_PAIRS

from harness.cli import run_cli


def _cli(*args: str) -> subprocess.CompletedProcess:
    """The verb through a real process (``python -m model_core``): the contract's test."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "model_core", "circuit", *args], check=False, cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env=env)


def _here(*args: str) -> subprocess.CompletedProcess:
    """The verb in this process (``harness.cli``): the tests of its options and messages."""
    return run_cli("circuit", *args, env={"HF_HUB_OFFLINE": "1"})


def _pairs_file(tmp_path: Path, extra: list[dict] = ()) -> Path:
    path = tmp_path / "pairs.jsonl"
    rows = [p.to_dict() for p in TINY_PAIRS] + list(extra)
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def _trapezoid(x, y):
    return sum((x[i + 1] - x[i]) * (y[i] + y[i + 1]) / 2 for i in range(len(x) - 1))


def test_json_is_the_issues_contract(tmp_path, tiny_decoders):
    bad = {"clean": "The cat sat on the mat", "corrupt": "The cat sat on the mat and the", "answer": " cat",
           "foil": " bank"}
    done = _cli("--model", "pretrained", "--model-id", str(tiny_decoders["llama"]), "--dataset",
                str(_pairs_file(tmp_path, [bad])), "--steps", "2", "--json")
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)  # exactly one object: anything else on stdout fails here
    assert list(payload) == ["n", "clean", "corrupt", "method", "steps", "edges", "faithfulness"]
    assert payload["n"] == 5 and payload["method"] == "eap-ig" and payload["steps"] == 2
    edges = payload["edges"]
    # 2 layers x 4 heads: each layer's 12 head receivers read 1 + 5l senders, its MLP 4 more; logits reads all 11
    assert len(edges) == sum(12 * (1 + 5 * l) + (1 + 5 * l + 4) for l in range(2)) + 11
    assert edges[0][:2] == ["input", "a0.h0<q>"] and edges[-1][:2] == ["m1", "logits"]
    assert all(isinstance(s, str) and isinstance(r, str) and isinstance(v, float) for s, r, v in edges)
    faith = payload["faithfulness"]
    assert list(faith) == ["fractions", "faithfulness", "cpr", "cmd"]
    assert faith["fractions"] == list(FRACTIONS)
    assert faith["cpr"] == _trapezoid(faith["fractions"], faith["faithfulness"])
    assert faith["cmd"] == _trapezoid(faith["fractions"], [abs(1 - v) for v in faith["faithfulness"]])
    assert faith["faithfulness"][-1] == pytest.approx(1.0, abs=1e-5)
    assert "skipped pair 6 (row 6)" in done.stderr and "circuit:" in done.stderr  # problems and progress: stderr


def test_top_k_is_the_k_largest_by_abs_score(tmp_path, tiny_decoders):
    done = _here("--model", "pretrained", "--model-id", str(tiny_decoders["gpt2"]), "--dataset",
                str(_pairs_file(tmp_path)), "--method", "eap", "--top", "7", "--no-curve", "--json")
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert payload["method"] == "eap" and payload["steps"] == 1 and payload["faithfulness"] is None
    scores = [abs(v) for _, _, v in payload["edges"]]
    assert len(scores) == 7 and scores == sorted(scores, reverse=True) and scores[0] > 0


@pytest.mark.parametrize("content,name,expected", [
    ("", "pairs.jsonl", "empty"),
    ("just words\nno columns here\n", "pairs.txt", "neither JSONL"),
    ('{"clean": "The cat sat", "corrupt": "The cat sat on", "answer": " cat", "foil": " bank"}\n', "pairs.jsonl",
     "pair 1"),
])
def test_bad_datasets_give_one_line_and_exit_1(tmp_path, tiny_decoders, content, name, expected):
    path = tmp_path / name
    path.write_text(content)
    done = _here("--model", "pretrained", "--model-id", str(tiny_decoders["gpt2"]), "--dataset", str(path), "--json")
    assert done.returncode == 1 and done.stdout == ""
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0]


def test_unknown_generator_and_encoder_are_refused(tiny_decoders):
    done = _here("--model", "pretrained", "--model-id", str(tiny_decoders["gpt2"]), "--dataset", "nosuch:3:0",
                "--json")
    assert done.returncode == 1 and "generator" in done.stderr and done.stdout == ""
    done = _here("--model", "custom", "--dataset", "ioi:2:0", "--json")
    assert done.returncode == 1 and "decoder" in done.stderr


@pytest.mark.slow
def test_smollm2_on_ioi_pairs_names_the_nodes():
    done = _here("--model", "pretrained", "--model-id", "bundled:SmolLM2-135M-Instruct", "--dataset", "ioi:2:0",
                "--method", "eap", "--top", "50", "--json")
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert payload["n"] == 2 and payload["clean"] > 0 > payload["corrupt"]
    names = {n for s, r, _ in payload["edges"] for n in (s, r)}
    assert any(n.startswith("a") and ".h" in n and not n.endswith(">") for n in names)
    assert all(n == "input" or n == "logits" or n[0] in "am" for n in names)
    assert len(payload["faithfulness"]["faithfulness"]) == 10
