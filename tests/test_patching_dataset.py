"""Mean patching over a dataset: each pair through the one per-pair pipeline, each head's mean effect and spread, the
residual stream where the pairs share a template, problems listed and the valid pairs run, a Stop that keeps the
finished pairs; the ``patch --dataset`` verb on the bundled SmolLM2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tiny_models import build_tiny_decoder

from model_core.circuits.datasets import DatasetError, Pair

CAT = Pair("The cat sat on the mat", "The bank sat on the mat", " cat", " bank")
BANK = Pair("The bank sat on the mat", "The cat sat on the mat", " bank", " cat")
WORD = Pair("The word sat on the mat", "The model sat on the mat", " word", " model")
SHORT = Pair("The cat sat", "The bank sat", " cat", " bank")
LONGER = Pair("The cat sat on the mat", "The dog sat on the mat", " cat", " bank")  # ' do' 'g': one token more
SAME = Pair("The cat sat on the mat", "The cat sat on the mat", " cat", " bank")


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return build_tiny_decoder("llama", tmp_path_factory.mktemp("patch-dataset") / "llama")


@pytest.fixture(scope="module")
def resolved(llama):
    from model_core.trace.request import TraceRequest
    from model_core.trace.resolve import resolve

    return resolve(TraceRequest("pretrained", "", "", model_id=str(llama)), device="cpu")


def _one_pair(resolved, pair: Pair):
    """One pair's exact patching, step by step as the single-pair page runs it."""
    from model_core.effects.patching import exact_patching, prepare_runs
    from model_core.effects.patching_inputs import prepare_inputs

    runs = prepare_runs(resolved.family, resolved.model, prepare_inputs(resolved, *pair.to_dict().values()))
    return runs, exact_patching(resolved.family, resolved.model, runs)


def test_the_mean_and_spread_are_those_of_the_pairs_run_alone(resolved):
    from model_core.circuits.mean_patching import mean_patching

    result = mean_patching(resolved, [CAT, BANK, WORD])
    alone = [_one_pair(resolved, p) for p in (CAT, BANK, WORD)]
    heads = np.stack([exact.heads for _, exact in alone])
    assert result.n == 3 and not result.partial and result.problems == ()
    np.testing.assert_allclose(result.heads, heads.mean(axis=0), atol=1e-6)
    np.testing.assert_allclose(result.heads_std, heads.std(axis=0), atol=1e-6)
    np.testing.assert_allclose(result.residual, np.mean([exact.residual for _, exact in alone], axis=0), atol=1e-6)
    assert result.clean == pytest.approx(np.mean([runs.clean for runs, _ in alone]), abs=1e-6)
    assert result.corrupt == pytest.approx(np.mean([runs.corrupt for runs, _ in alone]), abs=1e-6)
    assert result.heads_std.max() > 0  # the pairs differ, so their spread is not 0


def test_bad_pairs_are_listed_and_the_valid_pairs_run(resolved):
    from model_core.circuits.mean_patching import mean_patching

    result = mean_patching(resolved, [CAT, LONGER, SAME, BANK])
    assert result.n == 2 and result.to_run == 3
    assert result.problems[0].startswith("pair 2 (row 2): the clean prompt is 8 tokens and the corrupted prompt 9")
    assert result.problems[1].startswith("pair 3 (row 3): The clean and corrupted prompts are the same tokens")
    alone = mean_patching(resolved, [CAT, BANK])
    np.testing.assert_allclose(result.heads, alone.heads, atol=1e-6)


def test_the_residual_stream_is_left_out_when_the_pairs_differ_in_length(resolved):
    from model_core.circuits.mean_patching import mean_patching

    result = mean_patching(resolved, [CAT, SHORT])
    assert result.n == 2 and result.residual is None
    assert "left out: the pairs have 5 to 8 tokens" in result.residual_note
    assert result.to_json()["residual"] is None and np.isfinite(result.heads).all()


def test_a_stop_keeps_the_pairs_finished(resolved):
    from model_core.circuits.mean_patching import mean_patching

    kept, seen = [], []

    def stop() -> bool:  # stop once the first pair is finished and kept
        return bool(kept)

    result = mean_patching(resolved, [CAT, BANK, WORD], stop=stop, keep=kept.append,
                           progress=lambda done, total: seen.append((done, total)))
    assert result.partial and result.n == 1
    np.testing.assert_allclose(result.heads, _one_pair(resolved, CAT)[1].heads, atol=1e-6)
    assert seen[0] == (0.0, 3) and all(t == 3 for _, t in seen) and max(d for d, _ in seen) <= 1.0


def test_a_dataset_with_no_valid_pair_is_refused(resolved):
    from model_core.circuits.mean_patching import mean_patching

    with pytest.raises(DatasetError, match="No pair of the dataset can run"):
        mean_patching(resolved, [LONGER])


def test_the_json_has_exactly_the_dataset_keys(resolved):
    from model_core.circuits.mean_patching import mean_patching

    out = json.loads(json.dumps(mean_patching(resolved, [CAT, LONGER, BANK]).to_json()))
    assert set(out) == {"n", "heads", "heads_std", "residual", "problems", "clean", "corrupt"}
    assert np.array(out["heads"]).shape == np.array(out["heads_std"]).shape == (2, 4)
    assert np.array(out["residual"]).shape == (2, 8) and len(out["problems"]) == 1


def test_the_patch_verb_with_a_jsonl_dataset_on_a_tiny_model(llama, tmp_path, capsys):
    from model_core.cli.main import main

    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(p.to_dict()) for p in (CAT, LONGER, BANK)))
    assert main(["patch", "--model", "pretrained", "--model-id", str(llama), "--dataset", str(path), "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)  # stdout holds the JSON alone
    assert out["n"] == 2 and out["problems"][0].startswith("pair 2 (row 2)")
    assert "mean patching: 2.0/2 pairs" in captured.err and "skipped pair 2" in captured.err


@pytest.mark.parametrize("argv, expected", [
    (["--dataset", "wiki:3:0"], "not a generator spec"),
    (["--dataset", "NOTES"], "neither JSONL"),
    (["--dataset", "ioi:2:0", "--clean", "x"], "leave out --clean"),
    (["--clean", "The cat sat on the mat"], "give --corrupt, --answer, --foil"),
])
def test_the_patch_verb_says_what_is_wrong(llama, tmp_path, capsys, argv, expected):
    from model_core.cli.main import main

    notes = tmp_path / "notes.txt"
    notes.write_text("just some prose\nand more")
    argv = [str(notes) if a == "NOTES" else a for a in argv]
    assert main(["patch", "--model", "pretrained", "--model-id", str(llama), *argv, "--json"]) == 1
    captured = capsys.readouterr()
    assert expected in captured.err and captured.out == ""


@pytest.mark.slow
def test_the_patch_verb_on_a_generated_dataset_of_the_bundled_smollm2(capsys):
    from model_core.cli.main import main
    from model_core.settings import BUNDLED_DECODER_ID

    assert main(["patch", "--model", "pretrained", "--model-id", BUNDLED_DECODER_ID, "--dataset", "facts:2:0",
                 "--device", "cpu", "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert set(out) == {"n", "heads", "heads_std", "residual", "problems", "clean", "corrupt"}
    assert out["n"] == 2 and out["problems"] == []
    assert np.array(out["heads"]).shape == np.array(out["heads_std"]).shape == (30, 9)
    assert np.array(out["residual"]).shape == (30, 6)  # the facts template: 6 tokens
    assert out["clean"] > 0 > out["corrupt"]  # SmolLM2 knows both facts
    assert "mean patching: 2.0/2 pairs" in captured.err


def test_the_patch_verb_prints_a_summary_without_json(llama, tmp_path, capsys):
    from model_core.cli.main import main

    path = tmp_path / "pairs.csv"
    path.write_text("clean,corrupt,answer,foil\n" + "\n".join(",".join(p.to_dict().values()) for p in (CAT, BANK)))
    assert main(["patch", "--model", "pretrained", "--model-id", str(llama), "--dataset", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("2 pairs; mean metric: clean ") and "top heads by |mean effect| (std over the pairs)" in out


@pytest.mark.slow
def test_mean_patching_of_generated_pairs_on_the_bundled_smollm2():
    from model_core.circuits.generators import generate
    from model_core.circuits.mean_patching import mean_patching
    from model_core.effects.patching import patched_metrics, prepare_runs
    from model_core.effects.patching_inputs import prepare_inputs
    from model_core.settings import BUNDLED_DECODER_ID
    from model_core.trace.request import TraceRequest
    from model_core.trace.resolve import resolve

    resolved = resolve(TraceRequest("pretrained", "", "", model_id=BUNDLED_DECODER_ID), device="cpu")
    pairs = generate("facts", 2, 0)
    result = mean_patching(resolved, pairs, residual=False)
    assert result.n == 2 and result.residual is None and result.heads.shape == (30, 9)
    top = np.argsort(-np.abs(result.heads), axis=None)[:3]
    patches = [("z", int(i // 9), int(i % 9)) for i in top]
    effects = []
    for pair in pairs:  # the three heads patched alone, pair by pair
        runs = prepare_runs(resolved.family, resolved.model, prepare_inputs(resolved, *pair.to_dict().values()))
        effects.append(runs.effect(patched_metrics(resolved.family, resolved.model, runs, patches)))
    np.testing.assert_allclose(result.heads.ravel()[top], np.mean(effects, axis=0), atol=1e-4)
    np.testing.assert_allclose(result.heads_std.ravel()[top], np.std(effects, axis=0), atol=1e-4)
    assert np.abs(result.heads).max() > 0.05  # some head carries the fact
