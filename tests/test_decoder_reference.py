"""The decoder references and tiny models are right: they reproduce transformers' own eager numbers."""

import json

import numpy as np
import torch

from decoder_reference import (
    expected_scaling, final_norm, load, output_weights, reference_forward, reference_masked_logits, reference_qkv,
    reference_value_norms, sentence_b_start,
)
from tiny_models import ADDS_BOS, NUM_HEADS, NUM_KV_HEADS, SPECIAL_TOKEN, build_tiny_decoder

TEXT = "time flies like an arrow\nfruit flies like a banana"
ATOL = 1e-5


def _causal_softmax(scores: np.ndarray) -> np.ndarray:
    """Softmax over keys with key j > query i masked out, by a naive loop. Shape: (..., q_pos, k_pos)."""
    out = np.zeros_like(scores, dtype=np.float64)
    for i in range(scores.shape[-2]):
        row = scores[..., i, : i + 1].astype(np.float64)
        row = np.exp(row - row.max(axis=-1, keepdims=True))
        out[..., i, : i + 1] = row / row.sum(axis=-1, keepdims=True)
    return out


def test_post_rotary_qk_reproduce_eager_attention(tiny_decoder):
    ref = reference_qkv(tiny_decoder, TEXT)
    scores = ref.scores()
    attentions = reference_forward(tiny_decoder, TEXT).weights
    np.testing.assert_allclose(_causal_softmax(scores), attentions, atol=ATOL, rtol=0)


def test_scaling_is_the_modules_own(tiny_decoder):
    _, model = load(str(tiny_decoder))
    modules = model.transformer.h if tiny_decoder.name == "gpt2" else model.model.layers
    for layer in modules:
        attn = layer.attn if tiny_decoder.name == "gpt2" else layer.self_attn
        assert attn.scaling == expected_scaling(model.config)


def test_kv_heads_follow_the_config(tiny_decoder):
    ref = reference_qkv(tiny_decoder, TEXT)
    kv = NUM_KV_HEADS[tiny_decoder.name]
    assert ref.queries.shape[1] == NUM_HEADS and ref.keys.shape[1] == ref.values.shape[1] == kv
    assert ref.kv_heads.tolist() == [h * kv // NUM_HEADS for h in range(NUM_HEADS)]


def test_heads_rebuild_the_output_projection(tiny_decoder):
    """Σ_h A_h V_h W_Oʰ (+ bias) is what the output projection returns: values and W_O blocks line up."""
    tokenizer, model = load(str(tiny_decoder))
    ref = reference_qkv(tiny_decoder, TEXT)
    attentions = reference_forward(tiny_decoder, TEXT).weights
    layer = 1
    block = model.transformer.h[layer].attn if tiny_decoder.name == "gpt2" else model.model.layers[layer].self_attn
    proj = block.c_proj if tiny_decoder.name == "gpt2" else getattr(block, "o_proj", getattr(block, "dense", None))
    seen = []
    handle = proj.register_forward_hook(lambda m, a, out: seen.append(out[0].detach().numpy()))
    try:
        with torch.no_grad():
            model(**tokenizer(TEXT, return_tensors="pt"))
    finally:
        handle.remove()
    w_o = output_weights(model, layer).numpy()
    d = ref.queries.shape[-1]
    rebuilt = sum(attentions[layer, h] @ ref.values[layer, ref.kv_heads[h]] @ w_o[h * d:(h + 1) * d]
                  for h in range(NUM_HEADS))
    if proj.bias is not None:
        rebuilt = rebuilt + proj.bias.detach().numpy()
    np.testing.assert_allclose(rebuilt, seen[0], atol=ATOL, rtol=0)


def test_value_norms_are_norms_of_projected_values(tiny_decoder):
    _, model = load(str(tiny_decoder))
    ref = reference_qkv(tiny_decoder, TEXT)
    norms = reference_value_norms(tiny_decoder, TEXT)
    d = ref.queries.shape[-1]
    w_o = output_weights(model, 0).numpy()
    h = NUM_HEADS - 1
    expected = [np.sqrt(((ref.values[0, ref.kv_heads[h], j] @ w_o[h * d:]) ** 2).sum())
                for j in range(ref.values.shape[2])]
    np.testing.assert_allclose(norms[0, h], expected, atol=ATOL, rtol=0)
    assert norms.shape == (2, NUM_HEADS, ref.values.shape[2]) and (norms > 0).all()


def test_hidden_states_are_before_the_final_norm(tiny_decoder):
    """transformers' last hidden state has the final norm applied; the reference's does not."""
    tokenizer, model = load(str(tiny_decoder))
    ref = reference_forward(tiny_decoder, TEXT)
    with torch.no_grad():
        out = model(**tokenizer(TEXT, return_tensors="pt"), output_hidden_states=True)
    theirs = torch.cat(out.hidden_states).numpy()
    np.testing.assert_allclose(ref.hidden_states[:-1], theirs[:-1], atol=ATOL, rtol=0)
    with torch.no_grad():
        normed = final_norm(model)(torch.tensor(ref.hidden_states[-1])).numpy()
        logits = model.lm_head(torch.tensor(normed)).numpy()
        cap = getattr(model.config, "final_logit_softcapping", None)  # Gemma-2 caps its logits too
        logits = logits if cap is None else cap * np.tanh(logits / cap)
    np.testing.assert_allclose(normed, theirs[-1], atol=ATOL, rtol=0)
    assert np.abs(ref.hidden_states[-1] - theirs[-1]).max() > 1e-2
    np.testing.assert_allclose(logits, ref.logits, atol=ATOL, rtol=0)


def test_masked_reference_switches_one_head_off(tiny_decoder):
    plain = reference_forward(tiny_decoder, TEXT)
    masked = reference_masked_logits(tiny_decoder, TEXT, layer=0, head=1)
    # The head's own layer attends as before (the mask acts after attention); everything after it changes.
    np.testing.assert_array_equal(masked.weights[0], plain.weights[0])
    np.testing.assert_array_equal(masked.hidden_states[0], plain.hidden_states[0])
    assert np.abs(masked.hidden_states[1] - plain.hidden_states[1]).max() > 1e-3
    assert np.abs(masked.weights[1] - plain.weights[1]).max() > 1e-3
    assert np.abs(masked.logits - plain.logits).max() > 1e-3


def test_attention_is_far_from_uniform(tiny_decoder):
    """Every head of the tiny models has a sharp pattern, so a test comparing patterns can fail."""
    attentions = reference_forward(tiny_decoder, TEXT).weights
    n = attentions.shape[-1]
    uniform = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]
    assert (np.abs(attentions - uniform).max(axis=(-1, -2)) > 0.3).all()


def test_tokens_are_byte_level_bpe(tiny_decoder):
    tokenizer, _ = load(str(tiny_decoder))
    tokens = tokenizer.convert_ids_to_tokens(tokenizer(TEXT).input_ids)
    assert tokenizer.is_fast
    assert "Ġflies" in tokens and "Ċ" in tokens and "Ġbanana" in tokens
    assert (tokens[0] == SPECIAL_TOKEN) == ADDS_BOS[tiny_decoder.name]
    assert tokens.count(SPECIAL_TOKEN) == int(ADDS_BOS[tiny_decoder.name])


def test_sentence_b_start_is_the_first_token_after_the_newline(tiny_decoder):
    tokenizer, _ = load(str(tiny_decoder))
    tokens = tokenizer.convert_ids_to_tokens(tokenizer(TEXT).input_ids)
    start = sentence_b_start(tiny_decoder, "time flies like an arrow", "fruit flies like a banana")
    assert tokens[start - 1] == "Ċ" and tokenizer.convert_tokens_to_string(tokens[start:]) == "fruit flies like a banana"


def test_tiny_decoders_are_deterministic(tmp_path):
    a = build_tiny_decoder("llama", tmp_path / "a")
    b = build_tiny_decoder("llama", tmp_path / "b")
    assert json.loads((a / "tokenizer.json").read_text()) == json.loads((b / "tokenizer.json").read_text())
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
