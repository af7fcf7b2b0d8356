"""Independent references for decoder traces, computed with transformers and plain forward hooks only.

Nothing here imports the app: the numbers come from the eager model itself (``output_attentions``), from
hooks on its projections, and from its modeling module's own ``apply_rotary_pos_emb``. The parity tests
hold the app's traces to these; ``test_decoder_reference.py`` holds these to the eager attention weights.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch


@dataclass(frozen=True)
class HeadVectors:
    """Every head's vectors as the eager attention uses them.

    Attributes:
        queries: after the rotary embedding. Shape: (layer, head, pos, d_head).
        keys: after the rotary embedding, per key/value head. Shape: (layer, kv_head, pos, d_head).
        values: per key/value head. Shape: (layer, kv_head, pos, d_head).
        kv_heads: the key/value head each query head reads, h // (heads / kv_heads). Shape: (head,) int64.
        scaling: scores = q @ k.T * scaling, before any soft cap.
        softcap: Gemma-2's attn_logit_softcapping: scores become softcap * tanh(scores / softcap); or None.
    """

    queries: np.ndarray
    keys: np.ndarray
    values: np.ndarray
    kv_heads: np.ndarray
    scaling: float
    softcap: float | None = None

    def __post_init__(self) -> None:
        _freeze(self)

    def scores(self) -> np.ndarray:
        """Pre-softmax scores of every query head, before the causal mask. Shape: (layer, head, q_pos, k_pos)."""
        scores = self.queries @ np.swapaxes(self.keys[:, self.kv_heads], -1, -2) * np.float32(self.scaling)
        return scores if self.softcap is None else self.softcap * np.tanh(scores / self.softcap)


@dataclass(frozen=True)
class Forward:
    """One eager forward pass.

    Attributes:
        tokens: the tokenizer's tokens of the text.
        logits: final next-token logits. Shape: (pos, vocab).
        hidden_states: the input of the first layer (the embeddings), then every decoder layer's output,
            before the final norm. Shape: (layer + 1, pos, hidden).
        weights: eager softmax weights. Shape: (layer, head, q_pos, k_pos).
    """

    tokens: tuple[str, ...]
    logits: np.ndarray
    hidden_states: np.ndarray
    weights: np.ndarray

    def __post_init__(self) -> None:
        _freeze(self)


def _freeze(result) -> None:
    """References are cached and shared between tests, so their arrays are read-only."""
    for value in vars(result).values():
        if isinstance(value, np.ndarray):
            value.setflags(write=False)


@lru_cache(maxsize=None)
def load(folder: str | Path):
    """The tokenizer and the eager model of a saved folder (cached; never mutate them)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager").eval()
    return tokenizer, model


def _encode(folder, text: str) -> tuple[torch.Tensor, tuple[str, ...]]:
    tokenizer, _ = load(str(folder))
    ids = tokenizer(text, return_tensors="pt").input_ids  # (1, pos)
    return ids, tuple(tokenizer.convert_ids_to_tokens(ids[0].tolist()))


def sentence_b_start(folder, text_a: str, text_b: str) -> int:
    """Index of the first token of B when a pair is joined as A, a newline, B (from the character offsets)."""
    tokenizer, _ = load(str(folder))
    enc = tokenizer(text_a + "\n" + text_b, return_offsets_mapping=True)
    b_from = len(text_a) + 1
    return next(i for i, (start, end) in enumerate(enc["offset_mapping"]) if end > start and start >= b_from)


def _layers(model) -> list:
    """The decoder layers: GPT-2's blocks or a Llama-like model's layers."""
    return list(model.transformer.h) if model.config.model_type == "gpt2" else list(model.model.layers)


def _attention(model, layer) -> torch.nn.Module:
    return layer.attn if model.config.model_type == "gpt2" else layer.self_attn


def _output_projection(model, layer) -> torch.nn.Module:
    attn = _attention(model, layer)
    if model.config.model_type == "gpt2":
        return attn.c_proj
    return attn.dense if model.config.model_type == "phi" else attn.o_proj


def final_norm(model) -> torch.nn.Module:
    """The norm between the last layer and the unembedding."""
    if model.config.model_type == "gpt2":
        return model.transformer.ln_f
    return model.model.final_layernorm if model.config.model_type == "phi" else model.model.norm


def _shape(model) -> tuple[int, int, int]:
    """(heads, kv_heads, d_head) from the config."""
    config = model.config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    d_head = getattr(config, "head_dim", None) or config.hidden_size // heads
    return heads, kv_heads, d_head


def _layer_output(output) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output


def _run(folder, text: str, pre_hooks: dict | None = None) -> Forward:
    """Eager forward with hooks: pre-norm hidden states from the layers themselves, optional pre-hooks."""
    _, model = load(str(folder))
    ids, tokens = _encode(folder, text)
    layers = _layers(model)
    captured: list[torch.Tensor] = []

    def first_input(module, args, kwargs):
        captured.append((args[0] if args else kwargs["hidden_states"]).detach().clone())

    handles = [layers[0].register_forward_pre_hook(first_input, with_kwargs=True)]
    handles += [layer.register_forward_hook(lambda m, a, out: captured.append(_layer_output(out).detach().clone()))
                for layer in layers]
    handles += [module.register_forward_pre_hook(hook) for module, hook in (pre_hooks or {}).items()]
    try:
        with torch.no_grad():
            out = model(input_ids=ids, output_attentions=True)
    finally:
        for handle in handles:
            handle.remove()
    assert len(captured) == len(layers) + 1
    return Forward(
        tokens=tokens,
        logits=out.logits[0].float().numpy(),
        hidden_states=torch.cat(captured).float().numpy(),  # (layer + 1, pos, hidden)
        weights=torch.cat(out.attentions).float().numpy(),  # (layer, head, q_pos, k_pos)
    )


def eager_attentions(folder, text: str) -> tuple[tuple[str, ...], np.ndarray]:
    """The tokens and the eager model's ``output_attentions``, stacked. Shape: (layer, head, q_pos, k_pos)."""
    ref = reference_forward(folder, text)
    return ref.tokens, ref.weights


@lru_cache(maxsize=None)
def reference_forward(folder, text: str) -> Forward:
    """Logits, pre-final-norm hidden states and attentions of the plain eager model."""
    return _run(folder, text)


@lru_cache(maxsize=None)
def reference_masked_logits(folder, text: str, layer: int, head: int) -> Forward:
    """The eager model with head ``head`` of layer ``layer`` off: its slice of the output projection's input is 0."""
    _, model = load(str(folder))
    _, _, d_head = _shape(model)

    def zero_head(module, args):
        x = args[0].clone()  # (1, pos, heads * d_head)
        x[..., head * d_head:(head + 1) * d_head] = 0
        return (x, *args[1:])

    return _run(folder, text, {_output_projection(model, _layers(model)[layer]): zero_head})


def _split_heads(x: torch.Tensor, d_head: int) -> torch.Tensor:
    return x.view(*x.shape[:2], -1, d_head).transpose(1, 2)  # (1, pos, n * d_head) -> (1, n, pos, d_head)


def _run_hooked(model, ids: torch.Tensor, handles: list) -> None:
    """One forward pass with the hooks, removed after it whatever happens."""
    try:
        with torch.no_grad():
            model(input_ids=ids)
    finally:
        for handle in handles:
            handle.remove()


def _gpt2_qkv(model, ids: torch.Tensor) -> list[tuple[torch.Tensor, ...]]:
    """(q, k, v) per layer from c_attn's output, split in three and into heads."""
    _, _, d_head = _shape(model)
    outputs: list[torch.Tensor] = []
    _run_hooked(model, ids, [block.attn.c_attn.register_forward_hook(lambda m, a, out: outputs.append(out.detach().clone()))
                             for block in model.transformer.h])
    hidden = model.config.hidden_size
    return [tuple(_split_heads(part, d_head) for part in out.split(hidden, dim=2)) for out in outputs]


def _rope_qkv(model, ids: torch.Tensor) -> list[tuple[torch.Tensor, ...]]:
    """(q, k, v) per layer: the projections' outputs, then the family's own q/k norms and rotary embedding."""
    heads, kv_heads, d_head = _shape(model)
    per_layer: list[dict] = [{} for _ in model.model.layers]
    handles = []
    for index, layer in enumerate(model.model.layers):
        attn, store = layer.self_attn, per_layer[index]

        def keep(name, store=store):
            return lambda module, args, out: store.__setitem__(name, out.detach().clone())

        def keep_rotary(module, args, kwargs, store=store):
            store["cos_sin"] = kwargs["position_embeddings"]

        handles.append(attn.register_forward_pre_hook(keep_rotary, with_kwargs=True))
        if hasattr(attn, "qkv_proj"):  # Phi-3: one fused projection, rows q, then k, then v
            handles.append(attn.qkv_proj.register_forward_hook(keep("qkv")))
        else:
            for name in ("q_proj", "k_proj", "v_proj"):
                handles.append(getattr(attn, name).register_forward_hook(keep(name)))
    _run_hooked(model, ids, handles)
    result = []
    for layer, store in zip(model.model.layers, per_layer):
        attn = layer.self_attn
        if "qkv" in store:
            q, k, v = store["qkv"].split([heads * d_head, kv_heads * d_head, kv_heads * d_head], dim=-1)
        else:
            q, k, v = store["q_proj"], store["k_proj"], store["v_proj"]
        q, k, v = (_split_heads(x, d_head) for x in (q, k, v))
        with torch.no_grad():
            if hasattr(attn, "q_norm"):  # Qwen3, Gemma-3: RMSNorm on each head before the rotation
                q, k = attn.q_norm(q), attn.k_norm(k)
            if getattr(attn, "qk_layernorm", False):  # Phi's optional LayerNorm, same place
                q, k = attn.q_layernorm(q), attn.k_layernorm(k)
            apply_rotary = sys.modules[type(attn).__module__].apply_rotary_pos_emb
            # Phi rotates only the first rotary_ndims of each head, and splits them off itself.
            rot = getattr(attn, "rotary_ndims", d_head)
            q_rot, k_rot = apply_rotary(q[..., :rot], k[..., :rot], *store["cos_sin"])
            q, k = torch.cat([q_rot, q[..., rot:]], -1), torch.cat([k_rot, k[..., rot:]], -1)
        result.append((q, k, v))
    return result


def expected_scaling(config) -> float:
    """The score scale a config implies: 1/sqrt(d_head), or Gemma-2/3's query_pre_attn_scalar**-0.5."""
    if getattr(config, "scale_attn_by_inverse_layer_idx", False) or not getattr(config, "scale_attn_weights", True):
        raise ValueError("GPT-2 configs that scale by layer or not at all have no single score scale.")
    scalar = getattr(config, "query_pre_attn_scalar", None)
    if scalar is not None:
        return float(scalar) ** -0.5
    heads = config.num_attention_heads
    d_head = getattr(config, "head_dim", None) or config.hidden_size // heads
    return float(d_head) ** -0.5


@lru_cache(maxsize=None)
def reference_qkv(folder, text: str) -> HeadVectors:
    """Queries and keys after the rotary embedding, values, the query head -> kv head map, and the scaling."""
    _, model = load(str(folder))
    ids, _ = _encode(folder, text)
    heads, kv_heads, _ = _shape(model)
    gpt2 = model.config.model_type == "gpt2"
    qkv = _gpt2_qkv(model, ids) if gpt2 else _rope_qkv(model, ids)
    stack = lambda i: torch.cat([t[i] for t in qkv]).float().numpy()  # noqa: E731 - (layer, n, pos, d_head)
    return HeadVectors(queries=stack(0), keys=stack(1), values=stack(2),
                       kv_heads=np.arange(heads, dtype=np.int64) // (heads // kv_heads),
                       scaling=expected_scaling(model.config),
                       softcap=getattr(model.config, "attn_logit_softcapping", None))


def output_weights(model, layer: int) -> torch.Tensor:
    """The output projection's weight as (heads * d_head, hidden): rows h*d_head.. belong to head h.

    GPT-2's Conv1D already stores (in, out); nn.Linear stores (out, in).
    """
    proj = _output_projection(model, _layers(model)[layer])
    return proj.weight.detach() if model.config.model_type == "gpt2" else proj.weight.detach().T


@lru_cache(maxsize=None)
def reference_value_norms(folder, text: str) -> np.ndarray:
    """‖v_j W_Oʰ‖ for every query head h, with head h's kv-head value. Shape: (layer, head, pos)."""
    _, model = load(str(folder))
    ref = reference_qkv(folder, text)
    heads, _, d_head = _shape(model)
    norms = []
    for layer in range(ref.values.shape[0]):
        w_o = output_weights(model, layer).float().numpy()  # (heads * d_head, hidden)
        per_head = [ref.values[layer, ref.kv_heads[h]] @ w_o[h * d_head:(h + 1) * d_head] for h in range(heads)]
        norms.append(np.linalg.norm(np.stack(per_head), axis=-1))  # (head, pos)
    out = np.stack(norms).astype(np.float32)
    out.setflags(write=False)
    return out
