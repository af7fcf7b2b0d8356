"""Chapter 3's walk through one encoder layer: every step's tensor, for the "Inside the encoder" page.

The numbers come from one forward pass of the from-scratch encoder through the one route (``Family.forward``,
under a turn of the route's gate): the layer's own records (queries, keys, values, scores, weights, head outputs,
concatenation, attention output) plus, as the hook layer's steps (``model_core.families.hooks``, the family's
``block_parts``), the inputs and outputs the records do not keep (the three embedding lookups, the two LayerNorms,
the feed-forward's linears and GELU). Nothing is recomputed by
hand, so the walk shows exactly what the model computed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from model_core.chapter3.model import TransformerForSequenceClassification
from model_core.families import FAMILIES
from model_core.families.encoding import EncodedInput
from model_core.families.hook_install import open_run
from model_core.families.hooks import HookRun
from model_core.gate import GATE
from model_core.walk.steps import WalkArrays, encoded_from_trace
from model_core.walk.steps import to_array as _np

__all__ = ["WalkArrays", "Walkthrough", "encoded_from_trace", "walk_layer"]


@dataclass(frozen=True, eq=False)
class Walkthrough(WalkArrays):
    """Every tensor of one forward pass that the chapter walks through, for one layer.

    Arrays are read-only float32 numpy arrays with the batch dimension dropped (ids are int64).

    Attributes:
        tokens: WordPiece tokens, [CLS] and [SEP] included.
        token_ids: Shape: (pos,).
        token_type_ids: Shape: (pos,).
        sentence_b_start: first token of sentence B, or None.
        layer: the layer walked through.
        norm_placement: "pre" (LayerNorm before each sublayer) or "post" (after the residual sum, BERT).
        causal: whether the causal mask was applied.
        token_embeddings: Shape: (pos, hidden).
        position_embeddings: Shape: (pos, hidden).
        token_type_embeddings: Shape: (pos, hidden).
        embedding_sum: token + position + token type, before LayerNorm. Shape: (pos, hidden).
        embeddings: after the embeddings' LayerNorm (the input of layer 0). Shape: (pos, hidden).
        layer_input: the residual stream entering ``layer``. Shape: (pos, hidden).
        attention_input: what the heads read (LayerNorm'd for pre-LN, raw for post-LN). Shape: (pos, hidden).
        queries: Shape: (head, pos, d_head).
        keys: Shape: (head, pos, d_head).
        values: Shape: (head, pos, d_head).
        scores: QKᵀ/√d_head before any mask. Shape: (head, q_pos, k_pos).
        masked_scores: scores with -inf where masked. Shape: (head, q_pos, k_pos).
        weights: softmax of the masked scores. Shape: (head, q_pos, k_pos).
        mask: True where a query may attend to a key. Shape: (q_pos, k_pos) bool.
        head_outputs: weights @ V per head. Shape: (head, pos, d_head).
        concat: the heads' outputs side by side. Shape: (pos, hidden).
        attention_output: the output projection of ``concat``. Shape: (pos, hidden).
        residual_1: layer input + attention output (before LayerNorm for post-LN). Shape: (pos, hidden).
        ffn_input: what the feed-forward reads. Shape: (pos, hidden).
        ffn_hidden: first linear's output, before GELU. Shape: (pos, intermediate).
        ffn_activation: after GELU. Shape: (pos, intermediate).
        ffn_output: second linear's output. Shape: (pos, hidden).
        residual_2: the second residual sum (before LayerNorm for post-LN). Shape: (pos, hidden).
        layer_output: the residual stream leaving ``layer``. Shape: (pos, hidden).
        final_hidden: the last layer's output. Shape: (pos, hidden).
        logits: the classifier head on [CLS]. Shape: (num_labels,).
        probabilities: softmax of ``logits``. Shape: (num_labels,).
    """

    token_type_ids: np.ndarray
    sentence_b_start: int | None
    norm_placement: str
    causal: bool
    position_embeddings: np.ndarray
    token_type_embeddings: np.ndarray
    embedding_sum: np.ndarray
    embeddings: np.ndarray
    ffn_hidden: np.ndarray
    ffn_activation: np.ndarray
    residual_2: np.ndarray
    logits: np.ndarray
    probabilities: np.ndarray

    def _check(self, n: int, n_heads: int, d_head: int) -> None:
        hidden = self.embeddings.shape[-1]
        assert self.concat.shape == (n, hidden) and n_heads * d_head == hidden
        assert self.norm_placement in ("pre", "post")

    @property
    def labels(self) -> tuple[str, ...]:
        """The tokens as the views label them (WordPieces read as they are)."""
        return self.tokens

    @property
    def intermediate_size(self) -> int:
        return int(self.ffn_hidden.shape[-1])


@torch.no_grad()
def walk_layer(model: TransformerForSequenceClassification, encoded: EncodedInput, layer: int) -> Walkthrough:
    """Run the encoder once and keep every step of layer ``layer``, from tokens to logits.

    Args:
        model: the from-scratch encoder (random, or BERT's weights via ``custom_from_bert``), eval mode.
        encoded: the tokenised input (``model_core.families.encoding.encode``).
        layer: which encoder layer to walk through.

    Raises:
        ValueError: ``layer`` is out of range, or the model is in training mode (dropout would
            make the numbers random).
    """
    family = FAMILIES["custom"]
    n_layers = family.n_layers(model.config)
    if not 0 <= layer < n_layers:
        raise ValueError(f"layer {layer} is out of range: this model has layers 0-{n_layers - 1}.")
    if model.training:
        raise ValueError("The model is in training mode; call model.eval() so dropout is off.")
    device = next(model.parameters()).device
    run = HookRun(steps=family.block_parts(model, layer), steps_layer=layer)  # this thread's pass alone
    with GATE.turn():  # the turn lasts until the walk's arrays are numpy
        with open_run(model, family, run):
            out = family.forward(model, encoded.input_ids.to(device), encoded.token_type_ids.to(device), None,
                                 vectors=False, hidden=False).model_output
        return _walk_of(model, encoded, layer, out, {name: t[0] for name, t in run.kept.items()})


def _walk_of(model: TransformerForSequenceClassification, encoded: EncodedInput, layer: int, out: Any,
             seen: dict[str, torch.Tensor]) -> Walkthrough:
    """The pass's records and kept steps of ``layer`` as a ``Walkthrough``."""
    enc = out.encoder
    record = enc.layers[layer]
    heads = record.heads
    stack = lambda pick: _np(torch.stack([pick(h)[0] for h in heads]))  # noqa: E731  (head, ...)
    n = encoded.input_ids.shape[1]
    pre = model.config.norm_placement == "pre"
    logits = out.logits[0]
    return Walkthrough(
        tokens=tuple(encoded.tokens),
        token_ids=encoded.input_ids[0].cpu().numpy().astype(np.int64),
        token_type_ids=encoded.token_type_ids[0].cpu().numpy().astype(np.int64),
        sentence_b_start=encoded.sentence_b_start,
        layer=layer,
        norm_placement=model.config.norm_placement,
        causal=bool(model.config.causal),
        token_embeddings=_np(seen["token_embeddings"]),
        # The position lookup has batch 1 by construction (arange(pos).unsqueeze(0)).
        position_embeddings=_np(seen["position_embeddings"]),
        token_type_embeddings=_np(seen["token_type_embeddings"]),
        embedding_sum=_np(seen["embedding_sum"]),
        embeddings=_np(enc.hidden_states[0][0]),
        layer_input=_np(enc.hidden_states[layer][0]),
        # Pre-LN: the heads read LayerNorm(x); post-LN (BERT): they read x itself.
        attention_input=_np(seen["ln1_out"] if pre else enc.hidden_states[layer][0]),
        queries=stack(lambda h: h.query),
        keys=stack(lambda h: h.key),
        values=stack(lambda h: h.value),
        scores=stack(lambda h: h.step.scores),
        masked_scores=stack(lambda h: h.step.masked_scores),
        weights=stack(lambda h: h.step.weights),
        mask=np.ones((n, n), dtype=bool) if enc.mask is None else _np(enc.mask[0]) > 0.5,
        head_outputs=stack(lambda h: h.step.output),
        concat=_np(record.concat[0]),
        attention_output=_np(record.attention_output[0]),
        # Pre-LN: x + attn enters the second LayerNorm; post-LN: it enters the first.
        residual_1=_np(seen["ln2_in"] if pre else seen["ln1_in"]),
        ffn_input=_np(seen["ffn_input"]),
        ffn_hidden=_np(seen["ffn_hidden"]),
        ffn_activation=_np(seen["ffn_activation"]),
        ffn_output=_np(seen["ffn_output"]),
        # Pre-LN: the layer output is the raw sum; post-LN: the sum enters the second LayerNorm.
        residual_2=_np(record.output[0] if pre else seen["ln2_in"]),
        layer_output=_np(record.output[0]),
        final_hidden=_np(enc.last_hidden_state[0]),
        logits=_np(logits),
        probabilities=_np(torch.softmax(logits, dim=-1)),
    )
