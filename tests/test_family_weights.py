"""model_core.families.weights: every family's attention weights in TransformerLens's form reproduce the model's own
q, k, v projections (on the layer's normalised input) and its output projection, read by plain forward hooks."""

from __future__ import annotations

import pytest
import torch

from model_core.families.weights import LayerWeights, layer_weights

TOL = 1e-5


def _perturb_norms(model: torch.nn.Module) -> None:
    """Random norm weights and biases (seeded): a test that forgot a norm's scale, or Gemma's 1 + w, fails."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if any(part in name.lower() for part in ("norm", "ln_")):
                param.add_(0.3 * torch.randn(param.shape, generator=gen))


class _Recorder:
    """Forward hooks on named modules: each one's first input and its output, from the last pass."""

    def __init__(self) -> None:
        self.inputs: dict[str, torch.Tensor] = {}
        self.outputs: dict[str, torch.Tensor] = {}
        self.handles = []

    def watch(self, name: str, module: torch.nn.Module) -> None:
        def hook(_m, args, kwargs, output):
            first = args[0] if args else kwargs.get("hidden_states", kwargs.get("input"))
            self.inputs[name] = first.detach()[0]  # batch 1 -> (pos, ...)
            out = output[0] if isinstance(output, tuple) else output
            if isinstance(out, torch.Tensor):  # a block's own record (the chapter-3 encoder's) is not read
                self.outputs[name] = out.detach()[0]
        self.handles.append(module.register_forward_hook(hook, with_kwargs=True))

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def _run(model: torch.nn.Module, ids: torch.Tensor, **kwargs) -> None:
    from model_core.gate import GATE

    with GATE.turn(), torch.no_grad():
        model(ids, **kwargs)


def _run_watched(model: torch.nn.Module, rec: _Recorder, vocab: int, n: int) -> None:
    """Run ``model`` on ``n`` seeded random ids below ``vocab`` while ``rec`` watches, then stop watching."""
    ids = torch.randint(1, vocab, (1, n), generator=torch.Generator().manual_seed(0))
    try:
        _run(model, ids)
    finally:
        rec.close()


def _expected_qkv(lw: LayerWeights, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v of every head from the weights. Shape: x (pos, d_model) -> (pos, head|kv_head, d_head) each."""
    xn = lw.normed(x)
    out = []
    for W, b in ((lw.W_Q, lw.b_Q), (lw.W_K, lw.b_K), (lw.W_V, lw.b_V)):
        y = torch.einsum("pd,hde->phe", xn, W)
        out.append(y if b is None else y + b)
    return tuple(out)


def _expected_out(lw: LayerWeights, z: torch.Tensor) -> torch.Tensor:
    """The output projection from the weights. Shape: z (pos, head * d_head) -> (pos, d_model)."""
    z = z.view(z.shape[0], lw.n_heads, lw.d_head)
    y = torch.einsum("phe,hed->pd", z, lw.W_O)
    return y if lw.b_O is None else y + lw.b_O


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.shape == want.shape, (what, got.shape, want.shape)
    torch.testing.assert_close(got, want, rtol=TOL, atol=TOL, msg=lambda m: f"{what}: {m}")


def _check_layer(lw: LayerWeights, x: torch.Tensor, q, k, v, z, out, where: str) -> None:
    eq, ek, ev = _expected_qkv(lw, x)
    pos = x.shape[0]
    _close(eq, q.reshape(pos, lw.n_heads, lw.d_head), f"{where} q")
    _close(ek, k.reshape(pos, lw.n_kv_heads, lw.d_head), f"{where} k")
    _close(ev, v.reshape(pos, lw.n_kv_heads, lw.d_head), f"{where} v")
    _close(_expected_out(lw, z), out, f"{where} output projection")


def test_decoder_weights_reproduce_projections(tiny_decoder):
    from transformers import AutoModelForCausalLM

    family = tiny_decoder.name
    model = AutoModelForCausalLM.from_pretrained(tiny_decoder, attn_implementation="eager").eval()
    _perturb_norms(model)
    weights = layer_weights(model)
    gpt2 = family == "gpt2"
    blocks = model.transformer.h if gpt2 else model.model.layers
    assert len(weights) == len(blocks)
    rec = _Recorder()
    for i, block in enumerate(blocks):
        attn = block.attn if gpt2 else block.self_attn
        rec.watch(f"{i}.block", block)
        for name in ("c_attn", "q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj", "dense", "c_proj"):
            if hasattr(attn, name):
                rec.watch(f"{i}.{name}", getattr(attn, name))
    _run_watched(model, rec, model.config.vocab_size, 9)
    for i, lw in enumerate(weights):
        x, o = rec.inputs[f"{i}.block"], rec.outputs
        n_q, n_kv = lw.n_heads * lw.d_head, lw.n_kv_heads * lw.d_head
        if gpt2:
            q, k, v = o[f"{i}.c_attn"].split(n_q, dim=-1)
        elif f"{i}.qkv_proj" in o:
            q, k, v = o[f"{i}.qkv_proj"].split([n_q, n_kv, n_kv], dim=-1)
        else:
            q, k, v = o[f"{i}.q_proj"], o[f"{i}.k_proj"], o[f"{i}.v_proj"]
        out_name = next(f"{i}.{n}" for n in ("o_proj", "dense", "c_proj") if f"{i}.{n}" in o)
        _check_layer(lw, x, q, k, v, rec.inputs[out_name], o[out_name], f"{family} layer {i}")


def test_decoder_weights_know_the_family_quirks(tiny_decoders):
    from tiny_models import NUM_HEADS, NUM_KV_HEADS, QUERY_PRE_ATTN_SCALAR
    from transformers import AutoModelForCausalLM

    for family in ("gemma2", "qwen3", "phi3", "gpt2"):
        model = AutoModelForCausalLM.from_pretrained(tiny_decoders[family], attn_implementation="eager").eval()
        lw = layer_weights(model)[0]
        assert lw.kv_of_head == tuple(h // (NUM_HEADS // NUM_KV_HEADS[family]) for h in range(NUM_HEADS)), family
        if family == "gemma2":  # Gemma: 1 + weight, the attention-output norm, query_pre_attn_scalar
            norm = model.model.layers[0].input_layernorm.weight
            torch.testing.assert_close(lw.ln1_w, 1.0 + norm)
            assert lw.out_norm_w is not None and lw.scale == pytest.approx(QUERY_PRE_ATTN_SCALAR ** -0.5)
        if family == "qwen3":
            assert lw.q_norm_w.shape == (lw.n_heads, lw.d_head) and lw.k_norm_w.shape == (lw.n_kv_heads, lw.d_head)
            assert lw.out_norm_w is None
        if family == "gpt2":
            assert lw.ln1_kind == "layer" and lw.ln1_b is not None and lw.b_Q is not None
        if family == "phi3":
            assert lw.ln1_kind == "rms" and lw.b_Q is None


def _tiny_bert():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64, attn_implementation="eager")
    return BertModel(config).eval()


def test_bert_weights_reproduce_projections():
    model = _tiny_bert()
    _perturb_norms(model)
    weights = layer_weights(model)
    rec = _Recorder()
    for i, layer in enumerate(model.encoder.layer):
        sa = layer.attention.self
        rec.watch(f"{i}.layer", layer)
        for name in ("query", "key", "value"):
            rec.watch(f"{i}.{name}", getattr(sa, name))
        rec.watch(f"{i}.dense", layer.attention.output.dense)
    _run_watched(model, rec, 120, 7)
    for i, lw in enumerate(weights):
        assert lw.ln1_kind is None and lw.ln1_w is None  # post-LN: nothing normalises the layer's input
        o = rec.outputs
        _check_layer(lw, rec.inputs[f"{i}.layer"], o[f"{i}.query"], o[f"{i}.key"], o[f"{i}.value"],
                     rec.inputs[f"{i}.dense"], o[f"{i}.dense"], f"bert layer {i}")


@pytest.mark.parametrize("placement", ["pre", "post"])
def test_custom_encoder_weights_reproduce_projections(placement):
    from model_core.chapter3.config import EncoderConfig
    from model_core.chapter3.model import build_random_model

    config = EncoderConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, max_position_embeddings=32, norm_placement=placement)
    model = build_random_model(config, seed=0)
    _perturb_norms(model)
    weights = layer_weights(model)
    rec = _Recorder()
    for i, layer in enumerate(model.encoder.layers):
        rec.watch(f"{i}.layer", layer)
        for h, head in enumerate(layer.attention.heads):
            for name in ("q", "k", "v"):
                rec.watch(f"{i}.{h}.{name}", getattr(head, name))
        rec.watch(f"{i}.out", layer.attention.output_linear)
    _run_watched(model, rec, 100, 6)
    for i, lw in enumerate(weights):
        assert (lw.ln1_kind is None) == (placement == "post")
        o = rec.outputs
        q, k, v = (torch.stack([o[f"{i}.{h}.{name}"] for h in range(lw.n_heads)], dim=1) for name in "qkv")
        _check_layer(lw, rec.inputs[f"{i}.layer"], q, k, v, rec.inputs[f"{i}.out"],
                     o[f"{i}.out"], f"custom {placement} layer {i}")
