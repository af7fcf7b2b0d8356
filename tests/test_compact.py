"""Compact traces of long inputs: every window equals eager attention, the statistics equal head_stats, the
overview equals block means of the full weights, and bad files or windows get one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.cli import run_cli
from model_core import TraceRequest, build_trace
from model_core.analysis.per_head import head_stats
from model_core.compact.trace import STAT_NAMES, CompactFormatError, load_compact, parse_window
from model_core.compact.build import build_compact
from model_core.compact.summary import largest_weights
from tiny_models import build_tiny_decoder

ROOT = Path(__file__).resolve().parents[1]
TEXT = " ".join(["the river and the valley keep an old promise, and every spring the water climbs"] * 3)


@pytest.fixture(scope="module")
def sliding(tmp_path_factory):
    """Tiny Mistral and Gemma 2 whose sliding window (8) is shorter than the text: the mask is not plain causal."""
    folders = {}
    for family in ("mistral", "gemma2"):
        folder = tmp_path_factory.mktemp(f"sliding-{family}")
        build_tiny_decoder(family, folder)
        config = json.loads((folder / "config.json").read_text())
        config["sliding_window"] = 8
        (folder / "config.json").write_text(json.dumps(config))
        folders[family] = folder
    return folders


@pytest.fixture(scope="module")
def llama(tiny_decoders) -> Path:
    return tiny_decoders["llama"]


def _pair(folder: Path):
    request = TraceRequest("pretrained", TEXT, model_id=str(folder))
    return build_trace(request, device="cpu"), build_compact(request, device="cpu")


def _check_equal(full, compact) -> None:
    assert compact.tokens == full.tokens
    for layer in range(full.n_layers):
        for head in range(full.n_heads):
            np.testing.assert_allclose(compact.weights(layer, head), full.weights[layer, head], atol=1e-5)
    np.testing.assert_allclose(compact.weights(1, 2, slice(30, 41), slice(3, 37)),
                               full.weights[1, 2, 30:41, 3:37], atol=1e-5)
    stats = head_stats(full)
    for ours, theirs in [("entropy", "entropy"), ("to_first", "to_cls"), ("to_self", "to_self"),
                         ("to_prev", "to_prev"), ("to_next", "to_next"), ("max_weight", "max_weight")]:
        np.testing.assert_allclose(compact.stats[ours], getattr(stats, theirs), atol=1e-5, err_msg=ours)
    # the app's traces leave the largest weight out and compute it on request, from the queries, keys and lse
    np.testing.assert_allclose(largest_weights(compact), stats.max_weight, atol=1e-5)


@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen2", "gemma2", "phi3"])
def test_every_window_equals_eager_attention(tiny_decoders, family):
    if family not in tiny_decoders:
        pytest.skip(f"no tiny {family} here")
    _check_equal(*_pair(tiny_decoders[family]))


@pytest.mark.parametrize("family", ["mistral", "gemma2"])
def test_sliding_window_layers_keep_their_own_mask(sliding, family):
    full, compact = _pair(sliding[family])
    _check_equal(full, compact)
    assert not compact.masks[compact.mask_of_layer[0]][20, 5]  # 15 tokens back: outside the window of 8


def test_a_trace_built_without_predictions_and_largest_weight_has_the_same_numbers(llama):
    request = TraceRequest("pretrained", TEXT, model_id=str(llama))
    full, lean = build_compact(request, device="cpu"), build_compact(request, device="cpu", predictions=False,
                                                                    largest_weight=False)
    assert lean.next_token_ids is None and "max_weight" not in lean.stats
    np.testing.assert_array_equal(lean.lse, full.lse)
    np.testing.assert_allclose(largest_weights(lean), full.stats["max_weight"], atol=1e-6)


def test_overview_cells_are_exact_block_means_and_rows_sum_to_one(llama):
    full, compact = _pair(llama)
    p, n = compact.pool, full.n_tokens
    m = compact.overview.shape[-1]
    assert m == -(-n // p)
    w = full.weights[1, 3].astype(np.float64)
    for r in range(m):
        for c in range(m):
            block = w[r * p:(r + 1) * p, c * p:(c + 1) * p]
            assert compact.overview[1, 3, r, c] == pytest.approx(block.sum(1).mean(), abs=1e-6)
    np.testing.assert_allclose(compact.overview.sum(-1), 1.0, atol=1e-5)


def _group_means_from_full(w: np.ndarray, starts: np.ndarray) -> np.ndarray:
    n = len(w)
    group_of = np.searchsorted(starts, np.arange(n), side="right") - 1
    member = np.eye(len(starts))[group_of]  # (pos, group)
    return (member.T @ w.astype(np.float64) @ member) / member.sum(0)[:, None]


@pytest.mark.parametrize("family", ["llama", "gemma2"])  # the fused kernel, and Gemma 2's capped scores in blocks
def test_grouped_and_pooled_heads_equal_the_full_weights_grouped(tiny_decoders, family):
    from model_core.compact.views import group_means, pooled_head

    full, compact = _pair(tiny_decoders[family])
    starts = np.array([0, 5, 6, 30, 31, 60])
    for layer, head in ((0, 0), (1, 3)):
        np.testing.assert_allclose(group_means(compact, layer, head, starts),
                                   _group_means_from_full(full.weights[layer, head], starts), atol=1e-6)
    cells, pool = pooled_head(compact, 1, 2, cells=16)
    assert cells.shape[0] == -(-full.n_tokens // pool) <= 16
    np.testing.assert_allclose(cells, _group_means_from_full(full.weights[1, 2], np.arange(0, full.n_tokens, pool)),
                               atol=1e-6)
    np.testing.assert_allclose(cells.sum(-1), 1.0, atol=1e-6)


def test_a_saved_trace_reads_back_the_same(llama, tmp_path):
    _, compact = _pair(llama)
    again = load_compact(compact.save(tmp_path / "c.npz"))
    assert again.tokens == compact.tokens and again.model_kind == compact.model_kind
    np.testing.assert_array_equal(again.weights(1, 0), compact.weights(1, 0))
    np.testing.assert_array_equal(again.masks, compact.masks)
    np.testing.assert_array_equal(again.next_token_ids, compact.next_token_ids)
    assert again.dtype == compact.dtype == "float32"


def test_a_bfloat16_compact_trace_says_its_precision_and_keeps_it_in_its_file(llama, tmp_path):
    from model_core.settings import Settings

    compact = build_compact(TraceRequest("pretrained", TEXT, model_id=str(llama)), device="cpu",
                            settings=Settings(dtype="bfloat16"))
    assert compact.dtype == "bfloat16" and compact.queries.dtype == np.float32
    assert load_compact(compact.save(tmp_path / "c.npz")).dtype == "bfloat16"


def test_files_that_are_not_ours_or_are_truncated_are_refused(llama, tmp_path):
    path = build_compact(TraceRequest("pretrained", "a short text", model_id=str(llama)),
                         device="cpu").save(tmp_path / "c.npz")
    (tmp_path / "cut.npz").write_bytes(path.read_bytes()[:2000])
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    for name, words in [("cut.npz", "truncated"), ("other.npz", "not a compact trace"), ("none.npz", "does not exist")]:
        with pytest.raises(CompactFormatError, match=words):
            load_compact(tmp_path / name)


def test_windows_out_of_range_name_the_valid_range(llama):
    _, compact = _pair(llama)
    n = compact.n_tokens
    with pytest.raises(ValueError, match=f"0 <= A < B <= {n}"):
        compact.weights(0, 0, slice(0, n + 1))
    with pytest.raises(ValueError, match="layers 0-1"):
        compact.weights(5, 0)
    with pytest.raises(ValueError, match="A:B"):
        parse_window("3-9", n, "--rows")
    assert parse_window(":7", n, "--rows") == slice(None, 7)


def test_a_compact_trace_refuses_head_masks_and_the_custom_encoder(llama):
    with pytest.raises(ValueError, match="head masking"):
        build_compact(TraceRequest("pretrained", "a text", model_id=str(llama),
                                   head_mask=((True, False, True, True), (True,) * 4)), device="cpu")
    with pytest.raises(ValueError, match="chapter-3 encoder"):
        build_compact(TraceRequest("custom", "a text"), device="cpu")


def _cli(*args: str) -> subprocess.CompletedProcess:
    """A verb through a real process (``python -m model_core``)."""
    return subprocess.run([sys.executable, "-m", "model_core", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


def test_cli_exports_a_compact_trace_and_writes_exact_windows(llama, tmp_path):
    (tmp_path / "prompt.txt").write_text(TEXT, encoding="utf-8")
    out = _cli("export", "--model", "pretrained", "--model-id", str(llama), "--text-file",
               str(tmp_path / "prompt.txt"), "--compact", "--out", str(tmp_path / "c.npz"))
    assert out.returncode == 0, out.stderr
    assert "forward: 100%" in out.stderr and "summary: 100%" in out.stderr  # progress
    got = _cli("weights", "--trace", str(tmp_path / "c.npz"), "--layer", "1", "--head", "2", "--rows", "10:20",
               "--cols", "0:15", "--out", str(tmp_path / "w.npy"))
    assert got.returncode == 0, got.stderr
    full = build_trace(TraceRequest("pretrained", TEXT, model_id=str(llama)), device="cpu")
    np.testing.assert_allclose(np.load(tmp_path / "w.npy"), full.weights[1, 2, 10:20, 0:15], atol=1e-5)
    bad = run_cli("weights", "--trace", str(tmp_path / "c.npz"), "--layer", "1", "--head", "2", "--rows", "0:9999",
               "--out", str(tmp_path / "w.npy"))
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "out of range" in bad.stderr


def test_cli_over_the_limit_says_the_limit_and_how_to_raise_it(llama, tmp_path):
    out = run_cli("export", "--model", "pretrained", "--model-id", str(llama), "--text", TEXT, "--compact",
                  "--max-tokens", "16", "--out", str(tmp_path / "c.npz"))
    assert out.returncode == 1 and "the limit is 16" in out.stderr and "--max-tokens" in out.stderr
    assert not (tmp_path / "c.npz").exists()


@pytest.mark.slow
def test_smollm2_windows_equal_eager_attention():
    from model_core.settings import BUNDLED_DECODER_ID

    request = TraceRequest("pretrained", " ".join([TEXT] * 9), model_id=BUNDLED_DECODER_ID)
    full, compact = build_trace(request, device="cpu"), build_compact(request, device="cpu")
    assert full.n_tokens > 400
    for layer in (0, 14, 29):
        for head in range(full.n_heads):
            np.testing.assert_allclose(compact.weights(layer, head), full.weights[layer, head], atol=1e-5)


def test_rollout_into_the_last_token_equals_the_full_rollout(llama):
    from model_core.analysis.rollout import attention_rollout
    from model_core.compact.views import rollout_row

    full, compact = _pair(llama)
    expected = attention_rollout(full.weights)[-1, -1]  # after the last layer, the row of the last token
    np.testing.assert_allclose(rollout_row(compact, -1), expected, atol=1e-6)
    np.testing.assert_allclose(rollout_row(compact, 7), attention_rollout(full.weights)[-1, 7], atol=1e-6)


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_a_compact_traces_predictions_are_the_full_traces(tiny_decoders, family):
    # One function unembeds both (the final norm, the unembedding, Gemma 2's final-logit softcap), from the last
    # layer's output that each pass records its own way.
    full, compact = _pair(tiny_decoders[family])
    np.testing.assert_array_equal(compact.next_token_ids, full.next_token_ids)
    np.testing.assert_allclose(compact.next_token_probs, full.next_token_probs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("window", [None, 100])  # plain causal (one fused call), and a sliding window's mask
def test_the_fused_and_the_streamed_summaries_agree_in_any_block_size(window):
    """A model on the CPU is summarised by torch's fused kernel, one on a GPU in streamed blocks of many rows
    (``block_rows``): the two routes give the same lse, overview and statistics, in any block size."""
    import torch

    from model_core.compact.summary import _summarise_blocks, _summarise_fused, block_rows, summarise_layer
    from model_core.compact.trace import LayerMask

    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(3, 600, 16, generator=gen) * 2, torch.randn(3, 600, 16, generator=gen) * 2
    allowed = torch.ones(600, 600, dtype=torch.bool).tril()
    if window:
        allowed &= ~torch.ones(600, 600, dtype=torch.bool).tril(-window)
    mask = LayerMask.of(allowed)
    fused = _summarise_fused(q, k, mask, 0.25, pool=19)
    for block in (256, 97, 600):
        streamed = _summarise_blocks(q, k, mask, 0.25, None, pool=19, block=block)
        np.testing.assert_allclose(streamed.lse.numpy(), fused.lse.numpy(), rtol=1e-6)
        np.testing.assert_allclose(streamed.overview.numpy(), fused.overview.numpy(), atol=1e-6)
        for name in fused.stats:
            np.testing.assert_allclose(streamed.stats[name].numpy(), fused.stats[name].numpy(), atol=2e-5,
                                       err_msg=name)
    assert list(summarise_layer(q, k, mask, 0.25, None, 19).stats) == list(STAT_NAMES)
    assert list(summarise_layer(q, k, mask, 0.25, None, 19, largest=False).stats) == list(STAT_NAMES[:-1])
    assert block_rows(9, 4096, torch.device("cpu")) == 256
    assert block_rows(9, 4096, torch.device("cuda")) == 1792  # 2^26 scores a block on a GPU
    assert block_rows(32, 8192, torch.device("cuda")) == 256
