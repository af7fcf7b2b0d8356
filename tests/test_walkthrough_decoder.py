"""model_core.walk.decoder: a Llama-like block's walk equals transformers' eager model (its tokenizer, weights,
residual stream and pre-softmax scores, from ``decoder_reference``), each step chains into the next as transformers
computes it, and the families without a block walk say why."""

from __future__ import annotations

import decoder_reference as reference
import numpy as np
import pytest
import torch

from model_core import TraceRequest, build_trace
from model_core.walk.build import build_walkthrough

WALKED = ("llama", "qwen3", "gemma2")  # plain; q/k norms before the rotary embedding; norms around each sublayer
TEXT = "time flies like an arrow"
LAYER = 1


@pytest.fixture(scope="module", params=WALKED)
def walked(request, tiny_decoders):
    from model_core.models.loading import load_pretrained

    folder = str(tiny_decoders[request.param])
    req = TraceRequest(model="pretrained", model_id=folder, text_a=TEXT)
    trace = build_trace(req)
    return request.param, trace, build_walkthrough(req, LAYER, trace), load_pretrained(folder).model, folder


def _repeat(kv: np.ndarray, kv_heads: np.ndarray) -> np.ndarray:
    return kv[kv_heads]  # (kv_head, pos, d) -> (head, pos, d)


def test_the_walk_has_the_tokenizers_pieces_and_their_readable_labels(walked):
    _, _, wt, _, folder = walked
    tokenizer, _ = reference.load(folder)
    ids = tokenizer(TEXT)["input_ids"]
    np.testing.assert_array_equal(wt.token_ids, ids)
    assert wt.tokens == tuple(tokenizer.convert_ids_to_tokens(ids))
    assert "".join(wt.labels).replace("␣", " ") == tokenizer.decode(ids)  # "Ġflies" reads "␣flies"


def test_the_walk_has_the_eager_models_weights_queries_and_residual_stream(walked):
    _, _, wt, _, folder = walked
    eager = reference.reference_forward(folder, TEXT)
    np.testing.assert_allclose(wt.weights, eager.weights[LAYER], atol=1e-5)
    np.testing.assert_allclose(wt.queries, reference.reference_qkv(folder, TEXT).queries[LAYER], atol=1e-5)
    np.testing.assert_allclose(wt.layer_input, eager.hidden_states[LAYER], atol=1e-5)
    np.testing.assert_allclose(wt.layer_output, eager.hidden_states[LAYER + 1], atol=1e-5)
    assert wt.next_ids[0] == eager.logits[-1].argmax()


def test_softmax_of_the_masked_scores_is_the_models_weights(walked):
    _, _, wt, _, _ = walked
    assert np.isneginf(wt.masked_scores[:, ~wt.mask]).all() and (wt.weights[:, ~wt.mask] == 0).all()
    np.testing.assert_array_equal(wt.mask, np.tril(np.ones_like(wt.mask)))
    np.testing.assert_allclose(torch.softmax(torch.tensor(wt.masked_scores), -1).numpy(), wt.weights, atol=1e-6)


def test_the_scores_are_the_eager_models_q_k_scaled_and_capped(walked):
    """q·kᵀ·scale recomputed from the block's own q/k projections, q/k norms and apply_rotary_pos_emb on the
    eager model's residual stream (Gemma 2's soft cap included), not read back from the trace."""
    _, _, wt, _, folder = walked
    expected = reference.reference_qkv(folder, TEXT).scores()[LAYER]  # (head, q_pos, k_pos)
    np.testing.assert_allclose(wt.scores, expected, atol=1e-5)


def test_the_rotary_step_is_transformers_rotation(walked):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    _, _, wt, _, _ = walked
    cos, sin = torch.tensor(wt.rotary_cos)[None], torch.tensor(wt.rotary_sin)[None]
    q, k = apply_rotary_pos_emb(torch.tensor(wt.queries_before_rotary)[None],
                                torch.tensor(wt.keys_before_rotary)[None], cos, sin)
    np.testing.assert_allclose(q[0].numpy(), wt.queries, atol=1e-5)
    np.testing.assert_allclose(k[0].numpy(), wt.keys, atol=1e-5)
    # a rotation keeps every query's length, and position 0 is not rotated at all
    np.testing.assert_allclose(np.linalg.norm(wt.queries, axis=-1), np.linalg.norm(wt.queries_before_rotary, axis=-1),
                               rtol=1e-5)
    np.testing.assert_allclose(wt.queries[:, 0], wt.queries_before_rotary[:, 0], atol=1e-6)


def test_heads_read_their_key_value_heads_and_the_output_projection_mixes_them(walked):
    _, _, wt, model, _ = walked
    values = _repeat(wt.values, wt.kv_heads)
    np.testing.assert_allclose(wt.head_outputs, wt.weights @ values, atol=1e-5)
    np.testing.assert_allclose(wt.concat, wt.head_outputs.transpose(1, 0, 2).reshape(wt.n_tokens, -1), atol=1e-6)
    o_proj = model.model.layers[LAYER].self_attn.o_proj
    with torch.no_grad():
        np.testing.assert_allclose(o_proj(torch.tensor(wt.concat)).numpy(), wt.attention_output, atol=1e-5)


def test_the_gated_mlp_multiplies_the_activated_gate_by_up(walked):
    family, _, wt, _, _ = walked
    np.testing.assert_allclose(wt.gated, wt.activation * wt.up, atol=1e-5)
    if family == "llama":  # SiLU; and the residual sums of a plain Llama block
        np.testing.assert_allclose(wt.activation, wt.gate / (1 + np.exp(-wt.gate)), atol=1e-5)
        np.testing.assert_allclose(wt.residual_1, wt.layer_input + wt.attention_output, atol=1e-5)
        np.testing.assert_allclose(wt.layer_output, wt.residual_1 + wt.ffn_output, atol=1e-5)


def test_rmsnorm_divides_by_the_root_mean_square(walked):
    family, _, wt, model, _ = walked
    weight = model.model.layers[LAYER].input_layernorm.weight.detach().numpy()
    scale = 1 + weight if family.startswith("gemma") else weight  # Gemma stores the weight minus 1
    x = wt.layer_input.astype(np.float64)
    expected = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + wt.rms_eps) * scale
    np.testing.assert_allclose(wt.attention_input, expected, atol=1e-4)


@pytest.mark.parametrize("family", ["gpt2", "phi3", "phi"])
def test_families_without_a_block_walk_say_why(tiny_decoders, family):
    from model_core.families.decoder import NoBlockWalk

    req = TraceRequest(model="pretrained", model_id=str(tiny_decoders[family]), text_a=TEXT)
    with pytest.raises(NoBlockWalk, match="block walk"):
        build_walkthrough(req, 0, build_trace(req))


def test_a_layer_out_of_range_says_the_range(tiny_decoders):
    req = TraceRequest(model="pretrained", model_id=str(tiny_decoders["llama"]), text_a=TEXT)
    with pytest.raises(ValueError, match="layers 0-1"):
        build_walkthrough(req, 5, build_trace(req))


def test_the_walk_stops_after_its_block_and_reads_the_next_token_from_the_trace(tiny_decoders):
    from model_core.models.loading import load_pretrained

    folder = str(tiny_decoders["llama"])
    req = TraceRequest(model="pretrained", model_id=folder, text_a=TEXT)
    trace = build_trace(req)
    last = load_pretrained(folder).model.model.layers[-1]
    ran = []
    handle = last.register_forward_hook(lambda *_: ran.append(1))
    try:
        wt = build_walkthrough(req, 0, trace)
    finally:
        handle.remove()
    assert not ran  # block 0 of 2: the last block was not run again
    np.testing.assert_array_equal(wt.next_ids, trace.next_token_ids[-1, :len(wt.next_ids)])
    np.testing.assert_allclose(wt.next_probs, trace.next_token_probs[-1, :len(wt.next_ids)], atol=1e-5)


def test_a_stopped_pass_ends_only_in_the_thread_that_asked(tiny_decoders):
    from model_core.families.capture import recording
    from model_core.families.hf import _PassStopped, _stopper

    with recording() as rec:
        with pytest.raises(_PassStopped):
            _stopper(rec)(None, (), None)
    _stopper(rec)(None, (), None)  # another pass (no recorder, or another one's) runs on
    with recording():
        _stopper(rec)(None, (), None)


def test_the_notebook_walks_a_block_too(tiny_decoders):
    import attention_explorer as ae

    wt = ae.walk(TEXT, 1, model=str(tiny_decoders["qwen2"]))
    assert wt.layer == 1 and wt.shapes()["queries"] == (4, wt.n_tokens, 16) and wt.shapes()["keys"][0] == 2


def test_the_token_embedding_is_the_lookup_itself(walked):
    _, _, wt, model, _ = walked
    table = model.model.embed_tokens.weight.detach().numpy()
    np.testing.assert_allclose(wt.token_embeddings, table[wt.token_ids], atol=1e-6)  # Gemma's √hidden not yet in
