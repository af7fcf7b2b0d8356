"""AttentionTrace: every number one forward pass produces, the same type for every model family."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from model_core.families import FAMILIES
from model_core.kernel import apply_mask, attention_scores
from model_core.trace.shape import TraceShape, arrays_nbytes, freeze_arrays
from model_core.words import WordSpans


@dataclass(frozen=True, eq=False)
class AttentionTrace(TraceShape):
    """Everything one forward pass shows, for every family alike (the chapter-3 encoder, BERT, the decoders).

    The arrays are read-only numpy arrays (float32 unless said), batch dimension dropped.
    Scores are not stored: they are derived exactly from ``queries`` and ``keys``
    (QKᵀ/√d_head), which keeps a 512-token trace a third of the size.

    Attributes:
        tokens: the tokenizer's tokens (WordPiece with [CLS] and [SEP], or a decoder's BPE pieces).
        token_ids: vocabulary ids. Shape: (pos,) int64.
        token_type_ids: 0 for sentence A, 1 for sentence B. Shape: (pos,) int64.
        sentence_b_start: index of the first token of sentence B, or None for one sentence.
        weights: the attention pattern, softmax of the masked scores. Shape: (layer, head, q_pos, k_pos).
        mask: True where a query may attend to a key (causal and/or padding). Shape: (q_pos, k_pos) bool.
        queries: after the rotary embedding where the model has one. Shape: (layer, head, pos, d_head).
        keys: each query head's key (its key/value head's, ``kv_heads``). Shape: (layer, head, pos, d_head).
        values: each query head's value, as keys. Shape: (layer, head, pos, d_head).
        value_norms: ‖v_j W_Oʰ‖, the norm of each value after the head's slice of the output
            projection (Kobayashi et al. 2020). Shape: (layer, head, pos).
        hidden_states: embeddings, then the output of every layer (the residual stream, before a decoder's
            final norm). Shape: (layer + 1, pos, hidden).
        model_kind: the family (``model_core.families``): "custom", "bert", "gpt2" or "llama".
        causal: whether the model applied a causal mask.
        description: one line saying which model and weights produced this.
        logits: classifier logits of the custom encoder's head, or None. Shape: (num_labels,).
        head_mask: which heads were switched on. Shape: (layer, head) bool.
        kv_heads: the key/value head each query head reads (grouped-query attention). Shape: (head,) int64.
        score_scale: scores are q·k times this (1/√d_head; Gemma: query_pre_attn_scalar^-1/2).
        score_softcap: Gemma 2's cap on its scores (scores = cap·tanh(q·k·scale / cap)), or None.
        special_tokens: the tokenizer's special tokens.
        next_token_ids: a decoder's top next-token predictions at every position, best first. Shape: (pos, k) int64.
        next_token_probs: their probabilities. Shape: (pos, k).
        next_token_strings: their text. Shape: (pos, k) as nested tuples.
        reply_start: where a generated reply starts (its first token's position; the prompt is before it), or None
            for a text that was typed in (``model_core.generate``).
        dtype: the precision the model ran in ("float32", "bfloat16", "float16"; AE_DTYPE). The arrays are float32
            either way, and the weights were softmaxed in float32.
    """

    tokens: tuple[str, ...]
    token_ids: np.ndarray
    token_type_ids: np.ndarray
    sentence_b_start: int | None
    weights: np.ndarray
    mask: np.ndarray
    queries: np.ndarray
    keys: np.ndarray
    values: np.ndarray
    value_norms: np.ndarray
    hidden_states: np.ndarray
    model_kind: str
    causal: bool
    description: str
    logits: np.ndarray | None = None
    head_mask: np.ndarray | None = field(default=None)
    kv_heads: np.ndarray | None = None
    score_scale: float | None = None
    score_softcap: float | None = None
    special_tokens: frozenset[str] = frozenset()
    next_token_ids: np.ndarray | None = None
    next_token_probs: np.ndarray | None = None
    next_token_strings: tuple[tuple[str, ...], ...] | None = None
    reply_start: int | None = None
    dtype: str = "float32"

    @property
    def attentions(self) -> np.ndarray:
        """The old name of ``weights`` (transformers' ``output_attentions``), for notebooks written against it."""
        return self.weights

    def __post_init__(self) -> None:
        n_layers, n_heads, n_q, n_k = self.weights.shape
        n = len(self.tokens)
        assert n_q == n_k == n, (self.weights.shape, n)
        assert self.mask.shape == (n, n)
        assert self.queries.shape[:3] == (n_layers, n_heads, n) == self.keys.shape[:3] == self.values.shape[:3]
        assert self.value_norms.shape == (n_layers, n_heads, n)
        assert self.hidden_states.shape[:2] == (n_layers + 1, n)
        assert self.token_type_ids.shape == (n,) and self.token_ids.shape == (n,)
        assert self.model_kind in FAMILIES, self.model_kind
        if self.head_mask is None:
            object.__setattr__(self, "head_mask", np.ones((n_layers, n_heads), dtype=bool))
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", np.arange(n_heads, dtype=np.int64))
        if self.score_scale is None:
            object.__setattr__(self, "score_scale", 1.0 / math.sqrt(self.queries.shape[-1]))
        assert self.kv_heads.shape == (n_heads,)
        assert self.next_token_ids is None or self.next_token_ids.shape[0] == n
        if self.reply_start is not None:
            object.__setattr__(self, "reply_start", int(self.reply_start))
            assert 0 < self.reply_start < n, (self.reply_start, n)
        freeze_arrays(self)

    # -- sizes ---------------------------------------------------------------------------
    def words(self):
        """The words of the tokens, joined by this family's rule (``model_core.words.WordSpans``)."""
        return WordSpans.from_tokens(self.tokens, rule=self.family.word_rule, specials=self.special_tokens)

    @property
    def hidden_size(self) -> int:
        return int(self.hidden_states.shape[-1])

    @property
    def nbytes(self) -> int:
        """Bytes held by the trace's arrays."""
        return arrays_nbytes(self)

    # -- scores, derived -----------------------------------------------------------------
    def head_scores(self, layer: int, head: int) -> np.ndarray:
        """Scores QKᵀ·scale (scale 1/√d_head for most models) of one head, before any mask.

        Shape: (q_pos, k_pos).
        """
        self._check_head(layer, head)
        return self._scores(self.queries[layer, head], self.keys[layer, head])

    def layer_scores(self, layer: int) -> np.ndarray:
        """Scores QKᵀ·scale of every head of one layer, before any mask. Shape: (head, q_pos, k_pos)."""
        self._check_head(layer, 0)
        return self._scores(self.queries[layer], self.keys[layer])

    @property
    def scores(self) -> np.ndarray:
        """All scores QKᵀ·scale before any mask. Shape: (layer, head, q_pos, k_pos)."""
        return self._scores(self.queries, self.keys)

    def _scores(self, q: np.ndarray, k: np.ndarray) -> np.ndarray:
        """The score kernel's scores (``model_core.kernel``) in float32, Gemma 2's cap included."""
        return attention_scores(q.astype(np.float32, copy=False), k.astype(np.float32, copy=False),
                                scale=self.score_scale, softcap=self.score_softcap).numpy()

    @property
    def masked_scores(self) -> np.ndarray:
        """All scores with -inf where masked. Shape: (layer, head, q_pos, k_pos)."""
        return apply_mask(self.scores, self.mask, inplace=True).numpy()

    def _check_head(self, layer: int, head: int) -> None:
        if not (0 <= layer < self.n_layers and 0 <= head < self.n_heads):
            raise ValueError(
                f"layer {layer}, head {head} is out of range: this model has layers 0-{self.n_layers - 1} "
                f"and heads 0-{self.n_heads - 1}."
            )
