"""The walk through one Llama-like decoder block (Llama, Qwen2/3, Mistral, Gemma, SmolLM2): every step's tensor, for
the "Inside the model" page, as chapter 3's walk does for the encoder (``model_core.walk.encoder``).

The numbers come from one forward pass through the app's one route (``Family.forward``, under a turn of the
route's gate until the walk's arrays are numpy), stopped after the block:
the capturing attention function gives the queries and keys after the rotary embedding, the key/value heads' values
and the softmax weights; the hook layer (``model_core.families.hooks``) gives the block's input and output
(``hook_resid_pre``, ``hook_resid_post``), its rotary cos and sin, and, as the run's steps, what goes in and out of
RMSNorm, the q/k/v projections, the output projection and the gated MLP (``Family.block_parts``). The scores are the trace's queries times its keys, scaled
as the model scales them (``AttentionTrace.layer_scores``; a test checks that their softmax is the model's
weights). The next token comes from the model's final norm and unembedding applied to the trace's last
block output, so the blocks after the walked one are not run again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from model_core.families.hook_install import open_run
from model_core.families.hooks import HookRun
from model_core.families.parts import BlockNotes
from model_core.gate import GATE
from model_core.kernel import apply_mask
from model_core.trace.forward import top_predictions
from model_core.trace.trace import AttentionTrace
from model_core.walk.steps import WalkArrays, encoded_from_trace
from model_core.walk.steps import to_array as _np

TOP_NEXT = 10  # next tokens listed after the final norm and the unembedding


@dataclass(frozen=True, eq=False)
class DecoderWalk(WalkArrays):
    """Every tensor of one forward pass that the decoder walk shows, for one block.

    Arrays are read-only float32 numpy arrays with the batch dimension dropped (ids are int64).

    Attributes:
        tokens: the pieces, BOS included where the tokenizer adds one.
        labels: the pieces as people read them (``model_core.words.readable_tokens``).
        token_ids: Shape: (pos,).
        layer: the block walked through.
        norm_plus_one, qk_norm, sandwich_norms, activation_name, lookup_scale: what the page says about the block
            that differs by family (``model_core.families.parts.BlockNotes``): RMSNorm scales by (1 + w) (Gemma);
            per-head q/k norms before the rotary embedding (Qwen3, Gemma 3); norms around each sublayer (Gemma 2/3);
            "SiLU" or "GELU"; what the embedding module multiplies its lookup by (Gemma's √hidden), else 1.
        kv_heads: the key/value head each query head reads. Shape: (head,) int64.
        score_scale: what the model multiplies q·k by (1/√d_head, or Gemma's query_pre_attn_scalar^-0.5).
        rms_eps: the RMSNorm epsilon.
        token_embeddings: the embedding lookup (before Gemma's √hidden scaling). Shape: (pos, hidden).
        layer_input: the residual stream entering ``layer``. Shape: (pos, hidden).
        attention_input: RMSNorm of the layer input, what the heads read. Shape: (pos, hidden).
        queries_before_rotary, keys_before_rotary: the projections (and Qwen3/Gemma 3's q/k norms), per head.
            Shape: (head, pos, d_head) and (kv_head, pos, d_head).
        queries, keys: after the rotary embedding. Shape: as above.
        values: the key/value heads' values. Shape: (kv_head, pos, d_head).
        rotary_cos, rotary_sin: the rotary embedding's cos and sin of each position and dimension. Shape: (pos, d_head).
        scores: q·k times ``score_scale``, before any mask. Shape: (head, q_pos, k_pos).
        masked_scores: scores with -inf where the causal mask forbids. Shape: (head, q_pos, k_pos).
        weights: the model's softmax weights. Shape: (head, q_pos, k_pos).
        mask: True where a query may attend to a key. Shape: (q_pos, k_pos) bool.
        head_outputs: weights @ V per head. Shape: (head, pos, d_head).
        concat: the heads' outputs side by side, the output projection's input. Shape: (pos, head * d_head).
        attention_output: the output projection of ``concat``. Shape: (pos, hidden).
        residual_1: the stream after the attention sublayer's residual sum. Shape: (pos, hidden).
        ffn_input: RMSNorm of ``residual_1``, what the MLP reads. Shape: (pos, hidden).
        gate, up: the MLP's two projections. Shape: (pos, intermediate).
        activation: the activation of ``gate`` (SiLU, or Gemma's GELU). Shape: (pos, intermediate).
        gated: ``activation * up``, the down projection's input. Shape: (pos, intermediate).
        ffn_output: the down projection (Gemma 2/3: before its post-MLP norm). Shape: (pos, hidden).
        layer_output: the residual stream leaving ``layer``. Shape: (pos, hidden).
        final_hidden: the last block's output after the final norm. Shape: (pos, hidden).
        next_ids, next_strings, next_probs: the most likely next tokens after the last position. Shape: (TOP_NEXT,).
    """

    labels: tuple[str, ...]
    norm_plus_one: bool
    qk_norm: bool
    sandwich_norms: bool
    activation_name: str
    lookup_scale: float
    kv_heads: np.ndarray
    score_scale: float
    rms_eps: float
    queries_before_rotary: np.ndarray
    keys_before_rotary: np.ndarray
    rotary_cos: np.ndarray
    rotary_sin: np.ndarray
    gate: np.ndarray
    up: np.ndarray
    activation: np.ndarray
    gated: np.ndarray
    next_ids: np.ndarray
    next_strings: tuple[str, ...]
    next_probs: np.ndarray
    reply_start: int | None = None  # a generated sequence's first reply token (marked on the figures), else None

    def _check(self, n: int, n_heads: int, d_head: int) -> None:
        assert self.keys.shape == self.values.shape == (self.n_kv_heads, n, d_head)
        assert self.concat.shape == (n, n_heads * d_head)

    @property
    def n_kv_heads(self) -> int:
        return int(self.kv_heads.max()) + 1

    @property
    def intermediate_size(self) -> int:
        return int(self.gate.shape[-1])


def walk_decoder_layer(family: Any, model: Any, tokenizer: Any, trace: AttentionTrace, layer: int) -> DecoderWalk:
    """Run a Llama-like decoder up to block ``layer`` and keep every step of it; then the final norm and the
    unembedding on the last block's output, from the trace, for the next token.

    Args:
        family: the model's family adapter (``model_core.families.llama.LlamaFamily``).
        model: the causal LM, loaded by ``model_core.models.loading`` (eval mode, the capturing attention function).
        tokenizer: its tokenizer, for the next tokens' text.
        trace: the model's trace of the text (``build_trace``): the walk reads its tokens, labels and scores, and
            its last block's output, so the pass can stop after ``layer``.
        layer: which block.

    Raises:
        ValueError: ``layer`` is out of range, or the family has no block walk (``Family.block_parts``).
    """
    blocks = family.layers(model)
    if not 0 <= layer < len(blocks):
        raise ValueError(f"layer {layer} is out of range: this model has layers 0-{len(blocks) - 1}.")
    parts = family.block_parts(model, layer)
    notes = family.block_notes(model, layer)
    encoded = encoded_from_trace(trace)
    device = next(model.parameters()).device
    b = f"blocks.{layer}"
    # This thread's run alone: the model is shared, another session's pass never fills this walk. A shared
    # activation module runs in every block; the run keeps its call inside ``layer``.
    run = HookRun([f"{b}.hook_resid_pre", f"{b}.hook_resid_post"], keep_rope=True, steps=parts, steps_layer=layer)
    with GATE.turn():  # the turn lasts until the walk's arrays are numpy
        with open_run(model, family, run):  # the blocks after ``layer`` are not run: the trace has their output
            out = family.forward(model, encoded.input_ids.to(device), encoded.token_type_ids.to(device), None,
                                 vectors=True, hidden=False, stop_after=layer)
        seen = {name: t[0] for name, t in run.kept.items()}  # batch dimension dropped
        seen["layer_input"] = run.cache[f"{b}.hook_resid_pre"][0]
        seen["layer_output"] = run.cache[f"{b}.hook_resid_post"][0]
        if layer in run.rope:
            cos, sin = run.rope[layer]  # (batch, pos, d_head) each
            seen["rotary"] = (cos[0], sin[0])
        return _walk_of(family, model, tokenizer, trace, layer, notes, out, seen)


def _walk_of(family: Any, model: Any, tokenizer: Any, trace: AttentionTrace, layer: int, notes: BlockNotes,
             out: Any, seen: dict[str, Any]) -> DecoderWalk:
    """The pass's tensors of block ``layer``, the trace's last block output and the next tokens as a ``DecoderWalk``."""
    device = next(model.parameters()).device
    with torch.inference_mode():
        dtype = next(model.parameters()).dtype  # a copy: the trace's arrays are read-only
        residual = torch.tensor(np.asarray(trace.hidden_states[-1]), dtype=dtype, device=device)
        final_hidden = family.final_norm(model)(residual)  # (pos, hidden)
    ids, probs, strings = top_predictions(family, model, residual[-1:], TOP_NEXT, tokenizer)  # the last position's

    config = model.config
    n_heads, n_kv = family.n_heads(config), family.n_kv_heads(config)
    kv_heads = family.kv_heads(config)
    q, k, v = out.queries[layer][0], out.keys[layer][0], out.values[layer][0]  # (head | kv_head, pos, d_head)
    d_head, n = q.shape[-1], q.shape[1]
    scores = trace.layer_scores(layer)  # (head, q_pos, k_pos), Gemma 2's cap included
    masked = apply_mask(scores, trace.mask).numpy()
    weights = out.weights[layer][0]
    concat = seen["concat"]
    # A block without the rotary embedding (SmolLM3's no-RoPE layers) is given none: cos 1 and sin 0, no turn.
    cos, sin = seen.get("rotary", (torch.ones(n, d_head), torch.zeros(n, d_head)))
    embeddings = seen["token_embeddings"]
    if notes.lookup_scale != 1.0:  # Gemma's lookup multiplies by √hidden: show the lookup itself
        embeddings = embeddings / notes.lookup_scale
    return DecoderWalk(
        tokens=tuple(trace.tokens),
        labels=trace.labels,
        token_ids=np.array(trace.token_ids, dtype=np.int64),
        layer=layer,
        norm_plus_one=notes.norm_plus_one,
        qk_norm=notes.qk_norm,
        sandwich_norms=notes.sandwich,
        activation_name=notes.activation,
        lookup_scale=notes.lookup_scale,
        kv_heads=np.asarray(kv_heads, dtype=np.int64),
        score_scale=float(out.score_scale),
        rms_eps=notes.norm_eps,
        token_embeddings=_np(embeddings),
        layer_input=_np(seen["layer_input"]),
        attention_input=_np(seen["attention_input"]),
        queries_before_rotary=_np(seen["q_before"].reshape(n, n_heads, d_head).transpose(0, 1)),
        keys_before_rotary=_np(seen["k_before"].reshape(n, n_kv, d_head).transpose(0, 1)),
        queries=_np(q), keys=_np(k), values=_np(v),
        rotary_cos=_np(cos), rotary_sin=_np(sin),
        scores=scores, masked_scores=masked, weights=_np(weights),
        mask=np.array(trace.mask, dtype=bool),
        head_outputs=_np(concat.view(n, n_heads, d_head).transpose(0, 1)),
        concat=_np(concat),
        attention_output=_np(seen["attention_output"]),
        residual_1=_np(seen["residual_1"]),
        ffn_input=_np(seen["ffn_input"]),
        gate=_np(seen["gate"]), up=_np(seen["up"]), activation=_np(seen["activation"]), gated=_np(seen["gated"]),
        ffn_output=_np(seen["ffn_output"]),
        layer_output=_np(seen["layer_output"]),
        final_hidden=_np(final_hidden),
        next_ids=ids[0],
        next_strings=strings[0],
        next_probs=probs[0],
        reply_start=getattr(trace, "reply_start", None),
    )
