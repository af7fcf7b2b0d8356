"""The one attention score kernel (``model_core.kernel``): its maths, its parity with transformers' eager attention,
and a scan that no other module of ``model_core`` turns attention scores into weights by itself."""

import ast
import pathlib
import re
import warnings

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from decoder_reference import eager_attentions, reference_qkv
from model_core.kernel import (additive_mask, allowed_from_mask, apply_mask, attention_scores, causal_allowed,
                               expand_kv, pair_scores, pair_weights, row_lse, softmax_with_lse, weights_from_scores)
from model_core.models.bundled import ensure_bundled_decoder

ROOT = pathlib.Path(__file__).resolve().parents[1]
TEXT = "The cat sat on the mat because the mat was warm, and the cat stayed."


def _qk(n_heads: int = 3, n: int = 7, d_head: int = 8, seed: int = 0, spread: float = 1.0):
    """Random queries and keys. Shape: (head, pos, d_head) each, float32."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n_heads, n, d_head, generator=g) * spread
    return q, torch.randn(n_heads, n, d_head, generator=g) * spread


def _window_mask(n: int) -> torch.Tensor:
    """A causal mask with a sliding window of 3 (a key 3 or more behind the query is closed). Shape: (n, n) bool."""
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return (j <= i) & (i - j < 3)


# -- maths --------------------------------------------------------------------------------------
def test_scores_are_q_dot_k_times_the_scale():
    q, k = _qk()
    scores = attention_scores(q, k, scale=0.3)
    naive = torch.empty(3, 7, 7, dtype=torch.float64)
    for h in range(3):
        for i in range(7):
            for j in range(7):
                naive[h, i, j] = float(sum(q[h, i, d].double() * k[h, j, d].double() for d in range(8))) * 0.3
    assert scores.shape == (3, 7, 7) and scores.dtype == torch.float32
    assert_close(scores.double(), naive, atol=1e-5, rtol=0)


def test_rows_sum_to_one():
    q, k = _qk()
    weights = weights_from_scores(apply_mask(attention_scores(q, k, scale=0.35), _window_mask(7)))
    assert_close(weights.sum(-1), torch.ones(3, 7), atol=1e-6, rtol=0)


def test_masked_entries_are_minus_inf_before_the_softmax_and_zero_after():
    q, k = _qk()
    allowed = _window_mask(7)
    masked = apply_mask(attention_scores(q, k, scale=0.35), allowed)
    weights = weights_from_scores(masked)
    assert torch.all(masked[:, ~allowed] == float("-inf"))
    assert torch.isfinite(masked[:, allowed]).all()
    assert torch.all(weights[:, ~allowed] == 0.0)
    assert torch.all(weights[:, allowed] > 0.0)


def test_an_additive_mask_gives_the_boolean_masks_weights():
    q, k = _qk()
    allowed = _window_mask(7)
    scores = attention_scores(q, k, scale=0.35)
    hf_additive = torch.zeros(7, 7).masked_fill(~allowed, torch.finfo(torch.float32).min)  # as transformers builds it
    by_bool = weights_from_scores(apply_mask(scores, allowed))
    by_additive = weights_from_scores(apply_mask(scores, hf_additive))
    assert_close(by_additive, by_bool, atol=0, rtol=0)
    assert torch.equal(allowed_from_mask(hf_additive), allowed)
    assert torch.equal(allowed_from_mask(additive_mask(allowed, torch.float32)), allowed)
    assert torch.all(additive_mask(allowed, torch.float32)[~allowed] == float("-inf"))


def test_softcap_is_cap_times_tanh_of_the_scaled_scores():
    q, k = _qk(spread=4.0)  # scores of tens: the cap bites
    cap, scale = 5.0, 0.35
    plain = attention_scores(q, k, scale=scale)
    capped = attention_scores(q, k, scale=scale, softcap=cap)
    assert plain.abs().max() > 2 * cap
    assert capped.abs().max() < cap
    expected = cap * torch.tanh((q.double() @ k.double().transpose(-1, -2)) * scale / cap)
    assert_close(capped.double(), expected, atol=1e-5, rtol=0)


def test_weights_are_exp_of_the_masked_scores_minus_the_rows_lse():
    q, k = _qk()
    masked = apply_mask(attention_scores(q, k, scale=0.35), _window_mask(7)).double()
    lse = row_lse(masked)
    assert lse.dtype == torch.float64
    assert_close(weights_from_scores(masked, lse), torch.exp(masked - lse[..., None]), atol=0, rtol=0)
    assert_close(weights_from_scores(masked, lse), weights_from_scores(masked), atol=1e-12, rtol=0)
    # A window of keys read with the whole row's lse is exact, not renormalised over the window.
    assert_close(weights_from_scores(masked[..., 2:5], lse), weights_from_scores(masked)[..., 2:5], atol=1e-12, rtol=0)


def test_the_one_pass_softmax_gives_the_weights_the_lse_and_the_largest_weight():
    q, k = _qk()
    masked = apply_mask(attention_scores(q, k, scale=0.35), _window_mask(7))
    weights, lse, largest = softmax_with_lse(masked.clone(), inplace=True)
    assert_close(weights, weights_from_scores(masked), atol=1e-6, rtol=0)
    assert_close(lse, row_lse(masked), atol=1e-6, rtol=0)
    assert_close(largest, weights.amax(-1), atol=1e-6, rtol=0)


def test_pair_weights_equal_the_tile_at_those_pairs():
    q, k = _qk(seed=1)
    allowed = _window_mask(7)
    masked = apply_mask(attention_scores(q, k, scale=0.35, softcap=2.0), allowed).double()
    tile = weights_from_scores(masked)
    rows, cols = torch.tensor([0, 3, 6, 6, 2]), torch.tensor([0, 1, 6, 2, 5])  # (6, 2) and (2, 5) are masked
    scores = pair_scores(q[:, rows], k[:, cols], scale=0.35, softcap=2.0)
    got = pair_weights(scores, row_lse(masked)[:, rows], allowed[rows, cols])
    assert_close(got, tile[:, rows, cols], atol=1e-6, rtol=0)
    assert torch.all(got[:, [3, 4]] == 0.0)


def test_causal_allowed_equals_a_naive_loop():
    rows, cols = range(3, 7), range(0, 8)
    expected = torch.tensor([[j <= i for j in cols] for i in rows])
    assert torch.equal(causal_allowed(rows, cols), expected)


def test_each_query_head_reads_its_key_value_head():
    k = torch.randn(2, 5, 4, generator=torch.Generator().manual_seed(2))  # two key/value heads
    kv_heads = np.array([0, 0, 0, 1, 1, 1])
    assert torch.equal(expand_kv(k, kv_heads), k.repeat_interleave(3, dim=0))


def test_read_only_numpy_inputs_are_read_without_a_copy_or_a_warning():
    q, k = (t.numpy() for t in _qk())
    q.setflags(write=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scores = attention_scores(q, k, scale=0.35)
    assert_close(scores, attention_scores(torch.from_numpy(q.copy()), torch.from_numpy(k), scale=0.35))


# -- parity with transformers' eager attention ----------------------------------------------------
def _kernel_weights(folder, layer: int) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """The kernel's weights of one layer from the reference's queries and keys, and the eager model's own."""
    ref = reference_qkv(folder, TEXT)  # plain hooks on the eager model, no app code
    _, eager = eager_attentions(folder, TEXT)
    n = ref.queries.shape[2]
    scores = attention_scores(ref.queries[layer], expand_kv(ref.keys[layer], ref.kv_heads), scale=ref.scaling,
                              softcap=ref.softcap)
    masked = apply_mask(scores, causal_allowed(range(n), range(n)))
    return weights_from_scores(masked), masked, eager[layer]


@pytest.mark.slow
def test_weights_equal_eager_attention_on_the_bundled_smollm2():
    folder = ensure_bundled_decoder()  # SmolLM2-135M-Instruct, converted once from its bundled GGUF file
    ref = reference_qkv(folder, TEXT)
    assert ref.keys.shape[1] < ref.queries.shape[1]  # grouped-query attention: the kv-head map is exercised
    weights, masked, eager = _kernel_weights(folder, layer=5)
    assert_close(weights, torch.from_numpy(np.array(eager)), atol=1e-5, rtol=0)
    by_lse = weights_from_scores(masked.double(), row_lse(masked)).float()  # the compact trace's route
    assert_close(by_lse, torch.from_numpy(np.array(eager)), atol=1e-5, rtol=0)


def test_softcapped_weights_equal_eager_attention_on_gemma2(tiny_decoders):
    folder = tiny_decoders["gemma2"]
    assert reference_qkv(folder, TEXT).softcap is not None
    for layer in range(reference_qkv(folder, TEXT).queries.shape[0]):
        weights, _, eager = _kernel_weights(folder, layer)
        assert_close(weights, torch.from_numpy(np.array(eager)), atol=1e-5, rtol=0)


# -- one kernel: a scan of model_core ---------------------------------------------------------------
KERNEL = "model_core/kernel.py"
EXCEPTIONS = {
    "model_core/chapter3/model.py": "the from-scratch encoder is itself the model being traced: its attention_step "
                                    "is the book's scaled dot-product attention written out step by step, for "
                                    "readers, and its weights are the ones the trace records",
}
"""Files allowed their own softmax over attention scores, each with its reason."""
VOCABULARY = re.compile(r"logit|unembed|lm_head")  # a softmax over the vocabulary is not attention's
SCORE_NAMES = re.compile(r"\b(lse\w*|\w+_lse|\w*scores?|masked\w*)\b")
NEG_INF = re.compile(r"""-\s*(np|torch|math)\.inf\b|float\(["']-inf["']\)|\bNEG_INF\b""")


def _called(func: ast.expr) -> str | None:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


KERNEL_CALLS = frozenset({"softmax", "log_softmax", "logsumexp", "exp", "exp_", "tanh", "masked_fill", "masked_fill_",
                          "where"})


def kernel_copies(source: str) -> list[tuple[int, str, str]]:
    """Where a module turns attention scores into weights by itself: (line, what, code).

    - a softmax, log-softmax or log-sum-exp not over the vocabulary's logits;
    - an exponential of scores or of something minus a row's ``lse`` (a weight is ``exp(score - lse)``);
    - a tanh of scores (Gemma 2's softcap);
    - a mask fill or ``where`` that writes -inf into scores.
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = _called(node.func)
        if name not in KERNEL_CALLS:  # get_source_segment splits the source each time: only for the calls that count
            continue
        code = ast.get_source_segment(source, node) or ""
        operands = [*node.args, *(k.value for k in node.keywords)]
        args = " ".join(ast.get_source_segment(source, a) or "" for a in operands)
        if name in ("softmax", "log_softmax", "logsumexp") and not VOCABULARY.search(code):
            found.append((node.lineno, "softmax", code))
        elif name in ("exp", "exp_") and SCORE_NAMES.search(code):
            found.append((node.lineno, "weights", code))
        elif name == "tanh" and SCORE_NAMES.search(code):
            found.append((node.lineno, "softcap", code))
        elif name in ("masked_fill", "masked_fill_", "where") and NEG_INF.search(args) and SCORE_NAMES.search(args):
            found.append((node.lineno, "mask", code))
    return found


def test_the_scan_finds_each_kind_of_copy_and_passes_the_vocabulary():
    copies = kernel_copies(
        "w = torch.softmax(scores.masked_fill(~allowed, float('-inf')), dim=-1)\n"
        "lse = torch.logsumexp(masked, -1)\n"
        "w = torch.exp(masked - lse[:, None])\n"
        "w = s.sub_(row_lse).exp_()\n"
        "s = cap * torch.tanh(scores / cap)\n"
        "m = np.where(mask, scores, np.float32(-np.inf))\n")
    assert sorted(what for _, what, _ in copies) == ["mask", "softcap", "softmax", "softmax", "weights", "weights"]
    assert kernel_copies("p = torch.softmax(logits.float(), dim=-1)\n"
                         "lp = torch.log_softmax(out.lm_logits[0, -1].double(), dim=-1)\n"
                         "p = np.exp(log_p)\n"
                         "x = torch.tanh(logits / cap) * cap\n"
                         "flat = np.where(np.isfinite(grid), grid, -np.inf)\n") == []


def test_no_module_but_the_kernel_turns_attention_scores_into_weights():
    offenders = []
    for path in sorted((ROOT / "model_core").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == KERNEL or rel in EXCEPTIONS:
            continue
        offenders += [f"{rel}:{line}: {what}: {code[:80]}" for line, what, code in kernel_copies(path.read_text())]
    assert not offenders, ("attention scores turned into weights outside model_core/kernel.py; call its "
                           f"attention_scores / apply_mask / row_lse / weights_from_scores instead: {offenders}")


def test_every_exception_still_has_a_copy_and_a_reason():
    for rel, reason in EXCEPTIONS.items():
        assert kernel_copies((ROOT / rel).read_text()), f"{rel} no longer needs its exception: drop it"
        assert len(reason) > 40, rel


def test_the_kernel_imports_nothing_from_model_core_but_settings():
    tree = ast.parse((ROOT / KERNEL).read_text())
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert [m for m in imported if m.startswith("model_core") and m != "model_core.settings"] == []
