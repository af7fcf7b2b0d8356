"""The KV-cache policies read the same attention from a full trace, a compact trace and the prefill pass itself
(compact equals full where both fit); bad inputs get clear messages; the ``kv`` command line."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
from tiny_models import CORPUS

from model_core import TraceRequest, build_trace
from model_core.__main__ import main
from model_core.compact.build import build_compact
from model_core.generate.kv import compress, kv_compress, plan_kv
from model_core.generate.kv_batch import sweep
from model_core.generate.kv_sources import source_of
from model_core.generate.presses import (
    PRESSES,
    check_ratio,
    key_order,
    n_kept,
    press_scores,
)
from model_core.models.loading import load_pretrained

TEXT = CORPUS[:290]  # about 110 tokens of the tiny tokenizer: within the tiny models' 128 positions


@functools.cache
def _traces(folder: str):
    request = TraceRequest("pretrained", TEXT, model_id=folder)
    return load_pretrained(folder), build_trace(request), build_compact(request)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_full_compact_and_pass_sources_score_alike(tiny_decoders, family):
    loaded, full, compact = _traces(str(tiny_decoders[family]))
    assert 70 < full.n_tokens < 128
    plan = plan_kv(loaded.family, loaded.model, full.token_ids)
    for press in PRESSES:
        from_full = press_scores(source_of(full), press)
        from_compact = press_scores(source_of(compact), press)
        np.testing.assert_allclose(from_compact, from_full, rtol=1e-4, atol=1e-6)
        np.testing.assert_array_equal(key_order(from_full), plan.orders[press])
        np.testing.assert_array_equal(key_order(from_compact), plan.orders[press])


def test_retained_equals_the_full_traces_last_row(tiny_decoders):
    loaded, full, _ = _traces(str(tiny_decoders["llama"]))
    result = kv_compress(loaded.family, loaded.model, full.token_ids, "snapkv", 0.6, source=source_of(full))
    n = full.n_tokens
    expected = [[full.weights[la, h, n - 1, result.kept[la, full.kv_heads[h]]].sum() for h in range(full.n_heads)]
                for la in range(full.n_layers)]
    np.testing.assert_allclose(result.retained, expected, atol=1e-5)


def test_sweep_batches_equal_one_budget_at_a_time(tiny_decoders):
    """The sweep pads each policy's nine caches into one batch; every budget equals its own single pass."""
    loaded, full, _ = _traces(str(tiny_decoders["llama"]))
    plan = plan_kv(loaded.family, loaded.model, full.token_ids)
    calls = []
    result = sweep(plan, loaded.family, loaded.model, progress=lambda done, total: calls.append((done, total)))
    assert result.kl.shape == (5, 9) and np.isfinite(result.kl).all() and (result.kl >= 0).all()
    assert calls[-1] == (5, 5)
    for press in ("knorm", "tova"):
        i = PRESSES.index(press)
        for j, ratio in enumerate(result.ratios):
            one = compress(plan, loaded.family, loaded.model, press, ratio)
            assert result.kl[i, j] == pytest.approx(one.next_token_kl, abs=1e-6)
            assert result.top_changed[i, j] == one.top_changed
            assert result.retained[i, j] == pytest.approx(one.retained.mean(), abs=1e-9)
    assert len(result.to_rows()) == 45


@pytest.mark.parametrize("ratio", [0, 1, -0.1, 1.5, float("nan"), "half"])
def test_a_ratio_outside_zero_one_is_refused_with_its_meaning(ratio):
    with pytest.raises((ValueError, TypeError)) as err:
        check_ratio(ratio)
    if isinstance(err.value, ValueError) and ratio != "half":
        assert "strictly between 0 and 1" in str(err.value)


def test_a_ratio_that_keeps_nothing_says_which_ratio_would():
    assert n_kept(10, 0.85) == 1
    with pytest.raises(ValueError, match="keeps no key"):
        n_kept(10, 0.95)


def test_unknown_press_lists_the_policies(tiny_decoders):
    loaded, full, _ = _traces(str(tiny_decoders["llama"]))
    with pytest.raises(ValueError, match="streaming_llm, knorm, snapkv, tova, observed_attention"):
        kv_compress(loaded.family, loaded.model, full.token_ids, "h2o", 0.5)


def test_an_encoder_has_no_kv_cache(bert_pair_trace):
    with pytest.raises(ValueError, match="encoder has no KV cache"):
        source_of(bert_pair_trace)


def test_a_text_of_two_tokens_is_too_short(tiny_decoders):
    loaded = load_pretrained(str(tiny_decoders["llama"]))
    with pytest.raises(ValueError, match="at least 3"):
        plan_kv(loaded.family, loaded.model, np.array([5, 6]))


def test_a_trace_with_heads_switched_off_is_refused(tiny_decoders):
    folder = str(tiny_decoders["llama"])
    mask = tuple(tuple(h != 0 for h in range(4)) for _ in range(2))
    trace = build_trace(TraceRequest("pretrained", TEXT, model_id=folder, head_mask=mask))
    with pytest.raises(ValueError, match="heads switched off"):
        source_of(trace)


def test_cli_prints_kept_kl_and_retained(tiny_decoders, capsys):
    folder = str(tiny_decoders["qwen2"])
    assert main(["kv", "--model", "pretrained", "--model-id", folder, "--text", TEXT, "--press", "snapkv",
                 "--compression-ratio", "0.75", "--json", "--device", "cpu"]) == 0
    out = json.loads(capsys.readouterr().out)
    n_prefill = out["n_prefill"]
    assert len(out["kept"]) == 2 and len(out["kept"][0]) == 2  # layers x key/value heads
    assert all(len(positions) == int(n_prefill * 0.25) for layer in out["kept"] for positions in layer)
    assert np.array(out["retained"]).shape == (2, 4)
    assert out["next_token_kl"] >= 0 and out["n_kept"] == int(n_prefill * 0.25)


def test_cli_refuses_a_bad_press_or_ratio(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["kv", "--text", "time flies", "--press", "h2o", "--compression-ratio", "0.5"])
    assert exit_info.value.code == 2
    assert main(["kv", "--text", "time flies", "--press", "tova", "--compression-ratio", "1"]) == 2
    assert "strictly between 0 and 1" in capsys.readouterr().err


def test_cli_refuses_an_encoder(capsys):
    assert main(["kv", "--text", "time flies like an arrow", "--press", "tova", "--compression-ratio", "0.5"]) == 1
    assert "no KV cache" in capsys.readouterr().err


def test_notebook_kv_gives_the_result_and_its_figures(tiny_decoders):
    from attention_explorer.kv import kv, sweep_figure

    loaded, full, compact = _traces(str(tiny_decoders["llama"]))
    report = kv(compact, loaded.model, loaded.family, "tova", 0.5, tokenizer=loaded.tokenizer)
    assert report.kept.shape == (2, 2, int((full.n_tokens - 1) * 0.5))
    assert (report.kept[:, 0] == report.kept[:, 1]).all()  # TOVA: one set per layer, shared by the kv heads
    assert report.retained.shape == (2, 4) and report.kl >= 0
    assert len(report.kept_figure.data) == 2 and report.retained_figure.data[0].z.shape == (2, 4)
    assert "tova at 0.5" in repr(report)
    plan = plan_kv(loaded.family, loaded.model, full.token_ids, ("knorm", "tova"))
    assert len(sweep_figure(sweep(plan, loaded.family, loaded.model)).data) == 2


@pytest.mark.parametrize("block", [7, 32, 512])
def test_column_sums_stream_over_row_blocks_exactly(tiny_decoders, block):
    loaded, full, compact = _traces(str(tiny_decoders["gpt2"]))
    from model_core.generate.kv import prefill

    _, own = prefill(loaded.family, loaded.model, full.token_ids)
    for layer in range(full.n_layers):
        expected = source_of(full).column_sums(layer, block)
        np.testing.assert_allclose(source_of(compact).column_sums(layer, block), expected, atol=1e-5)
        np.testing.assert_allclose(own.column_sums(layer, block), expected, atol=1e-5)
