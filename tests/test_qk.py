"""The QK split: the terms sum to the model's own score on every family, each term equals an independent float64
reference, the log-odds identity holds, bad positions get clear messages, and the ``qk`` verb prints its contract."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.cli import run_cli
from model_core.chapter3.config import EncoderConfig
from model_core.chapter3.model import build_random_model
from model_core.families.hooked import run_with_hooks
from model_core.models.loading import load_pretrained, load_pretrained_uncached
from model_core.qk.terms import component_names, qk_terms
from model_core.settings import BUNDLED_DECODER_ID

ROOT = Path(__file__).resolve().parents[1]
IDS = torch.tensor([[3, 5, 7, 9, 11, 13, 4, 6, 8, 5, 7, 9]])


@pytest.fixture(scope="module")
def models(tiny_decoders, bundled):
    out = {f: load_pretrained(str(folder), device="cpu").model for f, folder in tiny_decoders.items()}
    out["bert"] = bundled.model
    for placement in ("pre", "post"):
        cfg = EncoderConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=32, norm_placement=placement)
        out[f"custom-{placement}"] = build_random_model(cfg, seed=0).eval()
    return out


def _pattern_row(model, layer, head, query):
    name = f"blocks.{layer}.attn.hook_pattern"
    return run_with_hooks(model, IDS, names=[name]).cache[name][0, head, query].double().numpy()


def test_terms_sum_to_the_models_score_and_weights_match_its_pattern(models):
    for label, model in models.items():
        for layer, head in ((0, 0), (1, 1)):
            r = qk_terms(model, None, IDS, layer, head, -1, row=True)
            tol = 1e-5 * max(1.0, abs(r.score))
            assert abs(float(r.terms.sum()) - r.score) <= tol, label
            assert abs(float(r.versus.terms.sum()) - r.versus.score) <= 1e-5 * max(1.0, abs(r.versus.score)), label
            pattern = _pattern_row(model, layer, head, r.query)
            assert abs(r.weight - pattern[r.key]) <= 1e-5, label
            assert abs(r.versus.weight - pattern[r.versus.key]) <= 1e-5, label
            assert r.key == int(np.argmax(pattern)), label  # the default key: the one it attends to most
            if r.softcap is None:  # log(a_ij / a_ij') = s_ij - s_ij'
                assert abs(np.log(r.weight / r.versus.weight) - r.versus.log_odds) <= 1e-5, label
                assert abs(r.versus.log_odds - (r.score - r.versus.score)) <= 1e-5, label
            col = r.row_keys.index(r.key)  # the row view's column at the key is the key side of the terms
            np.testing.assert_allclose(r.row[:, col], r.key_side, atol=1e-6)
            assert r.components == component_names(model, layer)


def test_components_follow_the_verbs_order(models):
    assert component_names(models["llama"], 0) == ["embed"]
    assert component_names(models["llama"], 1) == ["embed", "L0H0", "L0H1", "L0H2", "L0H3", "L0MLP"]
    gpt2 = component_names(models["gpt2"], 1)
    assert gpt2[:2] == ["embed", "pos"] and gpt2[-1] == "bias"  # GPT-2: learned positions, biases


def test_each_term_equals_a_float64_reference_on_gpt2(tiny_decoders):
    """GPT-2 in float64, with plain torch: every part of layer 1's input (embeddings, each layer-0 head through c_proj,
    the MLP, the output bias), ln_1 frozen at the whole residual, then c_attn's query and key slices."""
    model = load_pretrained_uncached(str(tiny_decoders["gpt2"]), device="cpu").model.double().eval()
    block0, block1 = model.transformer.h[0], model.transformer.h[1]
    n_heads = model.config.n_head
    got = {}
    hooks = [block0.attn.c_proj.register_forward_pre_hook(lambda m, a: got.__setitem__("z", a[0].detach())),
             block0.mlp.register_forward_hook(lambda m, a, o: got.__setitem__("mlp", o.detach())),
             block1.register_forward_pre_hook(lambda m, a, k: got.__setitem__("x", (k.get("hidden_states", None)
                                                                                     if a == () else a[0]).detach()),
                                              with_kwargs=True)]
    with torch.no_grad():
        model(IDS)
    for h in hooks:
        h.remove()
    d = model.config.n_embd
    d_head = d // n_heads
    w_o, b_o = block0.attn.c_proj.weight, block0.attn.c_proj.bias  # Conv1D: (in, out)
    z = got["z"][0].view(IDS.shape[1], n_heads, d_head)
    parts = {"embed": model.transformer.wte(IDS)[0], "pos": model.transformer.wpe(torch.arange(IDS.shape[1]))}
    for h in range(n_heads):
        parts[f"L0H{h}"] = z[:, h] @ w_o[h * d_head:(h + 1) * d_head]
    parts["L0MLP"] = got["mlp"][0]
    whole = got["x"][0]
    np.testing.assert_allclose((sum(parts.values()) + b_o).numpy(), whole.numpy(), atol=1e-9)
    ln = block1.ln_1
    inv = 1 / torch.sqrt(whole.var(-1, unbiased=False, keepdim=True) + ln.eps)
    c_attn = block1.attn.c_attn
    head, q_pos, k_pos = 1, IDS.shape[1] - 1, 3
    sl_q = slice(head * d_head, (head + 1) * d_head)
    sl_k = slice(d + head * d_head, d + (head + 1) * d_head)

    def through(p, pos, sl):
        x = (p[pos] - p[pos].mean()) * inv[pos] * ln.weight
        return x @ c_attn.weight[:, sl]
    names = list(parts)
    bias_q = ln.bias @ c_attn.weight[:, sl_q] + c_attn.bias[sl_q] + through(b_o[None].expand_as(whole), q_pos, sl_q)
    bias_k = ln.bias @ c_attn.weight[:, sl_k] + c_attn.bias[sl_k] + through(b_o[None].expand_as(whole), k_pos, sl_k)
    q = [through(parts[c], q_pos, sl_q) for c in names] + [bias_q]
    k = [through(parts[c], k_pos, sl_k) for c in names] + [bias_k]
    want = (torch.stack(q) @ torch.stack(k).T / np.sqrt(d_head)).numpy()
    r = qk_terms(model, None, IDS, 1, head, q_pos, k_pos)
    assert r.components == names + ["bias"]
    np.testing.assert_allclose(r.terms, want, atol=1e-4)
    assert float(np.abs(want).max()) > 1e-2  # the reference is not all zeros


def test_bad_positions_get_messages_naming_the_range(models):
    model = models["llama"]
    n = IDS.shape[1]
    with pytest.raises(ValueError, match=rf"0\.\.{n - 1}"):
        qk_terms(model, None, IDS, 1, 0, n + 3)
    with pytest.raises(ValueError, match="cannot see key"):
        qk_terms(model, None, IDS, 1, 0, 2, 5)  # a decoder's query 2 sees keys 0..2
    with pytest.raises(ValueError, match="layers 0..1"):
        qk_terms(model, None, IDS, 7, 0, -1)
    with pytest.raises(ValueError, match="heads 0..3"):
        qk_terms(model, None, IDS, 1, 9, -1)
    r = qk_terms(models["bert"], None, IDS, 1, 0, 2, 9)  # an encoder's query sees every key
    assert r.key == 9


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "model_core", "qk", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=600)


@pytest.mark.slow
def test_the_qk_verb_prints_its_contract_on_smollm2():
    text = "The cat sat on the mat. The cat sat on the"
    out = _cli("--model", "pretrained", "--model-id", BUNDLED_DECODER_ID, "--text", text, "--layer", "3",
               "--head", "2", "--query", "-1", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert set(data) == {"tokens", "layer", "head", "query", "key", "score", "weight", "components", "terms",
                         "versus"}
    tokenizer = load_pretrained(BUNDLED_DECODER_ID, device="cpu").tokenizer
    assert data["tokens"] == tokenizer.convert_ids_to_tokens(tokenizer(text).input_ids)  # no BOS, no template
    assert len(data["components"]) == 1 + 3 * 10  # embed, then 9 heads and the MLP of layers 0..2; no bias
    assert data["components"][:3] == ["embed", "L0H0", "L0H1"] and data["components"][-1] == "L2MLP"
    terms = np.array(data["terms"])
    assert terms.shape == (31, 31)
    assert abs(terms.sum() - data["score"]) <= 1e-5 * max(1, abs(data["score"]))
    v = data["versus"]
    assert set(v) == {"key", "score", "weight", "log_odds", "terms"} and v["key"] != data["key"]
    assert abs(v["log_odds"] - (data["score"] - v["score"])) <= 1e-5
    n = len(data["tokens"])
    assert data["query"] == n - 1
    bad = run_cli("qk", "--model", "pretrained", "--model-id", BUNDLED_DECODER_ID, "--text", text, "--layer", "3",
                  "--head", "2", "--query", "2", "--key", "5", "--json")  # in this process: the message's test
    assert bad.returncode == 1 and "cannot see key" in bad.stderr and bad.stdout == ""


def test_role_labels_name_a_head_for_its_strongest_role_above_the_threshold():
    from model_core.qk.describe import component_label, role_labels

    scores = {"previous_token": np.array([[0.9, 0.1], [0.2, np.nan]]),
              "induction": np.array([[0.5, 0.3], [0.7, 0.1]]), "retrieval": np.ones((2, 2))}
    labels = role_labels(scores)
    assert labels == {"L0H0": "a previous-token head", "L1H0": "an induction head"}  # retrieval is not a probe role
    assert component_label("L1H0", labels) == "L1 H0 (an induction head)" and component_label("L0H1", labels) == "L0 H1"


def test_the_json_has_exactly_the_issues_keys_even_with_a_softcap_or_one_visible_key(models):
    keys = ["tokens", "layer", "head", "query", "key", "score", "weight", "components", "terms", "versus"]
    capped = qk_terms(models["gemma2"], None, IDS, 1, 0, -1).to_json()  # Gemma 2 caps its scores
    assert list(capped) == keys and set(capped["versus"]) == {"key", "score", "weight", "log_odds", "terms"}
    first = qk_terms(models["llama"], None, IDS, 1, 0, 0).to_json()  # a decoder's first query sees one key
    assert list(first) == keys and first["versus"] is None and first["key"] == 0


def _trace(model, ids=IDS, head_mask=None):
    from model_core.families import family_of
    from model_core.families.encoding import EncodedInput
    from model_core.trace.forward import trace_model

    enc = EncodedInput(input_ids=ids, token_type_ids=torch.zeros_like(ids), sentence_b_start=None,
                       tokens=[str(t) for t in ids[0].tolist()])
    return trace_model(family_of(model), model, enc, "test", head_mask=head_mask)


def test_the_parts_from_a_full_trace_equal_the_hooked_pass_on_every_decoder(models):
    """The page's first pair: each earlier head's write rebuilt from the trace's pattern and values, each MLP as what
    its block added, the rotary from the family, no model run; the same parts, terms and weights as the hooked pass."""
    from model_core.families import family_of
    from model_core.families.weights import layer_weights
    from model_core.qk.gather import PartsPass
    from model_core.qk.terms import qk_pass, qk_pass_for_trace, split_at

    tokens = [str(t) for t in IDS[0].tolist()]
    served = []
    for label, model in models.items():
        family = family_of(model)
        trace = _trace(model)
        for layer, head in ((0, 1), (1, 0), (1, 3)):
            fast = PartsPass.from_trace(model, family, layer_weights(model)[layer], layer, head, trace)
            if not family.is_decoder:  # post-LN and normed embeddings: the hooked pass answers
                assert fast is None, label
                continue
            assert fast is not None, label
            slow = qk_pass(model, IDS, layer, head)
            scale = max(1.0, float(slow.Q_all.abs().max()), float(slow.K.abs().max()))
            assert float((fast.Q_all - slow.Q_all).abs().max()) <= 1e-5 * scale, (label, layer, head)
            assert float((fast.K - slow.K).abs().max()) <= 1e-5 * scale, (label, layer, head)
            a, b = split_at(fast, tokens, -1, row=True), split_at(slow, tokens, -1, row=True)
            assert (a.key, a.versus.key) == (b.key, b.versus.key), label
            np.testing.assert_allclose(a.terms, b.terms, atol=1e-5 * max(1.0, abs(b.score)))
            assert abs(float(a.terms.sum()) - a.score) <= 1e-5 * max(1.0, abs(a.score)), label
            assert abs(a.weight - b.weight) <= 1e-6, label
            served.append(label)
        assert qk_pass_for_trace(model, trace, 1, 0).Q_all.shape[0] == len(component_names(model, 1)), label
    assert {"gpt2", "llama", "gemma2", "gemma3_text", "qwen3", "phi"} <= set(served)


def test_a_trace_with_heads_switched_off_is_split_as_the_model_it_shows(models):
    """A head switched off wrote nothing: its component is zero, and the terms sum to the trace's own score."""
    from model_core.qk.terms import component_names, qk_pass_for_trace, split_at

    model = models["llama"]
    mask = np.ones((2, 4), dtype=bool)
    mask[0, 1] = False
    trace = _trace(model, head_mask=mask)
    r = split_at(qk_pass_for_trace(model, trace, 1, 0), [str(t) for t in IDS[0].tolist()], -1)
    off = component_names(model, 1).index("L0H1")
    assert not r.terms[off].any() and not r.terms[:, off].any()
    q, k = trace.queries[1, 0, r.query].astype(np.float64), trace.keys[1, 0, r.key].astype(np.float64)
    assert abs(r.score - float(q @ k) * float(trace.score_scale)) <= 1e-5
    assert abs(float(r.terms.sum()) - r.score) <= 1e-5 * max(1.0, abs(r.score))
    clean = split_at(qk_pass_for_trace(model, _trace(model), 1, 0), [str(t) for t in IDS[0].tolist()], -1, r.key)
    assert abs(clean.score - r.score) > 1e-4  # switching the head off changed the score the split explains


@pytest.mark.cuda
def test_the_split_runs_with_the_model_on_a_gpu(tiny_decoders):
    """The split runs on the CPU in float64 whatever the model's device: the trace's path and the hooked pass."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from model_core.qk.terms import qk_pass, qk_pass_for_trace, split_at

    model = load_pretrained_uncached(str(tiny_decoders["qwen3"]), device="cuda").model
    tokens = [str(t) for t in IDS[0].tolist()]
    fast = split_at(qk_pass_for_trace(model, _trace(model, IDS.cuda()), 1, 2), tokens, -1)
    slow = split_at(qk_pass(model, IDS.cuda(), 1, 2), tokens, -1, fast.key)
    np.testing.assert_allclose(fast.terms, slow.terms, atol=1e-4)
    assert abs(float(fast.terms.sum()) - fast.score) <= 1e-4 * max(1.0, abs(fast.score))
