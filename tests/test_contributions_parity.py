"""Parity: every node's contributions equal a plain reference written here (transformers' eager model, forward hooks
on its modules, explicit loops over keys and heads), for tiny GPT-2, Llama (GQA), Qwen2, Gemma 1-3, Qwen3, Mistral and Phi."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
import torch

TEXT = "time flies like an arrow and fruit flies like a banana"
FAMILIES = ("gpt2", "llama", "qwen2", "gemma", "gemma2", "gemma3_text", "qwen3", "mistral", "phi")
ATOL = 1e-5


@pytest.fixture(params=FAMILIES)
def tiny(request, tiny_decoders):
    return tiny_decoders[request.param]


@cache
def _flow(folder: str):
    from model_core import TraceRequest, build_trace
    from model_core.effects.graph_source import trace_flow
    from model_core.models.loading import load_pretrained

    trace = build_trace(TraceRequest("pretrained", TEXT, model_id=folder), device="cpu")
    loaded = load_pretrained(folder, device="cpu")
    return trace, trace_flow(trace, loaded.model, loaded.family)


@torch.no_grad()
@cache
def _reference(folder: str) -> list[dict]:
    """Per layer: resid_pre, resid_mid, resid_post, mlp part, and the mapped attention terms (q, k, head, d) and
    residual, from hooks on a freshly loaded eager model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    ids = AutoTokenizer.from_pretrained(folder)(TEXT, return_tensors="pt")["input_ids"]
    gpt2 = model.config.model_type == "gpt2"
    blocks = model.transformer.h if gpt2 else model.model.layers
    seen: dict = {}
    hooks = []

    def keep(name, index, output=True):
        def hook(module, args, out):
            seen[name, index] = (out[0] if isinstance(out, tuple) else out) if output else args[0]
        return hook

    for i, block in enumerate(blocks):
        hooks.append(block.register_forward_pre_hook(lambda m, a, kw, i=i: seen.__setitem__(("pre", i), kw.get(
            "hidden_states", a[0] if a else None)), with_kwargs=True))
        hooks.append(block.register_forward_hook(keep("post", i)))
        attn = block.attn if gpt2 else block.self_attn
        hooks.append(attn.register_forward_hook(keep("attn_out", i)))
        v_module = attn.c_attn if gpt2 else (attn.v_proj if hasattr(attn, "v_proj") else attn.qkv_proj)
        hooks.append(v_module.register_forward_hook(keep("v", i)))
    with torch.no_grad():
        out = model(ids, output_attentions=True)
    for h in hooks:
        h.remove()
    cfg = model.config
    n_heads = cfg.n_head if gpt2 else cfg.num_attention_heads
    n_kv = n_heads if gpt2 else cfg.num_key_value_heads
    layers = []
    for i, block in enumerate(blocks):
        pre, post = seen["pre", i][0].double(), seen["post", i][0].double()
        weights = out.attentions[i][0].double()  # (head, q, k)
        v = seen["v", i][0].double()
        d_model = pre.shape[-1]
        if gpt2:
            v = v[:, 2 * d_model:]
            w_o, b_o = block.attn.c_proj.weight.double().T, block.attn.c_proj.bias.double()
        else:
            attn = block.self_attn
            o = attn.o_proj if hasattr(attn, "o_proj") else attn.dense
            w_o = o.weight.double()
            b_o = o.bias.double() if o.bias is not None else torch.zeros(d_model, dtype=torch.float64)
        d_head = w_o.shape[1] // n_heads
        v = v.view(len(v), n_kv, d_head)
        n = len(pre)
        terms = torch.zeros(n, n, n_heads, d_model, dtype=torch.float64)
        for h in range(n_heads):
            w_h = w_o[:, h * d_head:(h + 1) * d_head]
            for j in range(n):
                u = w_h @ v[j, h // (n_heads // n_kv)]
                terms[:, j, h] = weights[h, :, j, None] * u
        attn_out = seen["attn_out", i][0].double()
        assert torch.allclose(terms.sum((1, 2)) + b_o, attn_out, atol=1e-5)
        if hasattr(block, "post_feedforward_layernorm"):  # Gemma 2: RMSNorm on the attention output, frozen
            norm = block.post_attention_layernorm
            scale = torch.rsqrt(attn_out.pow(2).mean(-1, keepdim=True) + norm.eps)
            gain = 1.0 + norm.weight.double()
            terms = terms * scale[:, None, None] * gain
            mid = pre + attn_out * scale * gain
        else:
            mid = pre + attn_out
        layers.append({"pre": pre, "mid": mid, "post": post, "terms": terms, "weights": weights})
    return layers


def _shares(parts: list[torch.Tensor], whole: torch.Tensor) -> list[torch.Tensor]:
    prox = [torch.clamp(whole.abs().sum(-1) - (p - whole).abs().sum(-1), min=1e-5) for p in parts]
    total = sum(p.sum() for p in prox)
    return [p / total for p in prox]


def test_contributions_equal_a_plain_reference(tiny):
    trace, flow = _flow(str(tiny))
    reference = _reference(str(tiny))
    for layer, ref in enumerate(reference):
        got = flow.layer(layer)
        n = len(ref["pre"])
        for i in range(n):
            keys = [j for j in range(n) for h in range(trace.n_heads) if ref["weights"][h, i, j] > 0]
            heads = [h for j in range(n) for h in range(trace.n_heads) if ref["weights"][h, i, j] > 0]
            parts = [ref["terms"][i, j, h] for j, h in zip(keys, heads)]
            shares = _shares([torch.stack(parts), ref["pre"][i]], ref["mid"][i])
            expected = np.zeros((n, trace.n_heads))
            expected[keys, heads] = shares[0].numpy()
            np.testing.assert_allclose(got.attention_heads[i], expected, atol=ATOL)
            assert got.attention_residual[i] == pytest.approx(float(shares[1]), abs=ATOL)
            ffn, res = _shares([ref["post"][i] - ref["mid"][i], ref["mid"][i]], ref["post"][i])
            assert got.ffn[i] == pytest.approx(float(ffn), abs=ATOL)
            assert got.ffn_residual[i] == pytest.approx(float(res), abs=ATOL)


def test_contributions_sum_to_one(tiny):
    _, flow = _flow(str(tiny))
    for layer in range(flow.n_layers):
        got = flow.layer(layer)
        np.testing.assert_allclose(got.attention_heads.sum((1, 2)) + got.attention_residual, 1.0, atol=1e-5)
        np.testing.assert_allclose(got.ffn + got.ffn_residual, 1.0, atol=1e-5)
        assert np.all(got.attention_heads >= 0)


def test_parts_rebuild_the_blocks(tiny):
    """Attention parts + residual + rest rebuild the hooked resid_mid; the MLP's parts rebuild resid_post."""
    _, flow = _flow(str(tiny))
    reference = _reference(str(tiny))
    for layer, ref in enumerate(reference):
        pos = np.arange(len(ref["pre"]))
        values = flow.source.values(layer)
        rows = flow.source.rows(layer, pos, len(pos))
        join, mlp = flow.joins(layer, pos)
        terms = torch.einsum("rhk,hmk->rm", rows * join.scale[:, None, None],
                             join.directions(flow.blocks.raw_directions(layer, values)))
        np.testing.assert_allclose(join.whole, ref["mid"].float(), atol=ATOL)
        np.testing.assert_allclose(terms + join.residual + join.rest, join.whole, atol=ATOL)
        np.testing.assert_allclose(mlp.mlp + mlp.residual + mlp.rest, ref["post"].float(), atol=ATOL)


def test_values_from_the_block_input_equal_the_traces(tiny_decoders):
    """A compact pass keeps no values: recomputed from each block's input they equal the full trace's."""
    for family in ("gpt2", "llama", "phi3", "gemma2", "phi"):
        trace, flow = _flow(str(tiny_decoders[family]))
        for layer in range(trace.n_layers):
            got = flow.blocks.values(layer, flow.source.hidden[layer])
            np.testing.assert_allclose(got.numpy(), trace.values[layer], atol=ATOL, err_msg=family)
