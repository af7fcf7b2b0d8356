"""What both walks (the encoder's and a decoder block's) share: the steps of one layer every walk has, what they say
about their tensors, and the trace's exact input. (The walks keep a module's input or output through the hook
layer's steps, ``model_core.families.hooks.HookRun``.)"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch

from model_core.families.encoding import EncodedInput
from model_core.trace.shape import arrays_nbytes, freeze_arrays
from model_core.trace.trace import AttentionTrace


@dataclass(frozen=True, eq=False)
class WalkArrays:
    """The steps of one layer that both walks keep, and what they say alike about them: sizes, per-token norms,
    score limits. Arrays are read-only float32 numpy arrays with the batch dimension dropped (ids are int64).

    Attributes:
        tokens: the tokenizer's tokens. token_ids: Shape: (pos,).
        layer: the layer walked through.
        token_embeddings: the token embedding lookup. Shape: (pos, hidden).
        layer_input: the residual stream entering ``layer``. attention_input: what the heads read. Shape: (pos, hidden).
        queries: Shape: (head, pos, d_head). keys, values: Shape: (head or kv_head, pos, d_head).
        scores: before any mask. masked_scores: -inf where masked. weights: the softmax. Shape: (head, q_pos, k_pos).
        mask: True where a query may attend to a key. Shape: (q_pos, k_pos) bool.
        head_outputs: weights @ V per head. Shape: (head, pos, d_head).
        concat: the heads' outputs side by side, the output projection's input. Shape: (pos, head * d_head).
        attention_output: the output projection of ``concat``. residual_1: after the attention sublayer's residual
            sum. ffn_input: what the feed-forward reads. ffn_output: its output. layer_output: the residual stream
            leaving ``layer``. final_hidden: the last layer's output (after a decoder's final norm). Shape: (pos, hidden).
    """

    tokens: tuple[str, ...]
    token_ids: np.ndarray
    layer: int
    token_embeddings: np.ndarray
    layer_input: np.ndarray
    attention_input: np.ndarray
    queries: np.ndarray
    keys: np.ndarray
    values: np.ndarray
    scores: np.ndarray
    masked_scores: np.ndarray
    weights: np.ndarray
    mask: np.ndarray
    head_outputs: np.ndarray
    concat: np.ndarray
    attention_output: np.ndarray
    residual_1: np.ndarray
    ffn_input: np.ndarray
    ffn_output: np.ndarray
    layer_output: np.ndarray
    final_hidden: np.ndarray

    def __post_init__(self) -> None:
        n, (n_heads, _, d_head) = len(self.tokens), self.queries.shape
        assert self.weights.shape == (n_heads, n, n), self.weights.shape
        self._check(n, n_heads, d_head)
        freeze_arrays(self)

    def _check(self, n: int, n_heads: int, d_head: int) -> None:
        """A walk's own shape invariants (asserts)."""

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def n_heads(self) -> int:
        return int(self.queries.shape[0])

    @property
    def d_head(self) -> int:
        return int(self.queries.shape[-1])

    @property
    def hidden_size(self) -> int:
        return int(self.layer_input.shape[-1])

    def nbytes(self) -> int:
        """Bytes held by the walk's arrays (what a cache bounded by bytes counts)."""
        return arrays_nbytes(self)

    def score_limit(self, head: int) -> float:
        """The largest finite |score| of ``head``, for a colour scale centred on 0 (1.0 if all are 0)."""
        scores = self.scores[head]
        return float(np.abs(scores[np.isfinite(scores)]).max(initial=0.0)) or 1.0

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Each array field's shape, by field name."""
        return {f.name: tuple(getattr(self, f.name).shape) for f in fields(self)
                if isinstance(getattr(self, f.name), np.ndarray)}

    def token_norms(self, name: str) -> np.ndarray:
        """The L2 norm of each token's vector in the field ``name``.

        Shape: (pos, dim) -> (pos,).

        Raises:
            ValueError: ``name`` is not a (pos, dim) field.
        """
        value = getattr(self, name, None)
        if not isinstance(value, np.ndarray) or value.shape[:1] != (self.n_tokens,) or value.ndim != 2:
            raise ValueError(f"{name!r} is not a per-token field; use one of "
                             f"{', '.join(k for k, s in self.shapes().items() if len(s) == 2 and s[0] == self.n_tokens)}.")
        return np.linalg.norm(value.astype(np.float64), axis=-1).astype(np.float32)


def encoded_from_trace(trace: AttentionTrace) -> EncodedInput:
    """The exact input a trace was computed from, so a walk reads the same tokens as every page."""
    return EncodedInput(
        tokens=tuple(trace.tokens),
        input_ids=torch.as_tensor(np.array(trace.token_ids, dtype=np.int64))[None],  # (1, pos)
        token_type_ids=torch.as_tensor(np.array(trace.token_type_ids, dtype=np.int64))[None],
        sentence_b_start=trace.sentence_b_start,
    )


def to_array(t: torch.Tensor) -> np.ndarray:
    """A tensor as a float32 numpy copy on the CPU."""
    return t.detach().to("cpu", torch.float32).numpy().copy()
