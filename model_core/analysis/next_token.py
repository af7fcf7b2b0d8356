"""What switching heads off does to a decoder's next-token prediction: the top predictions of both runs with
their probabilities, and how far the whole next-token distribution moved (total variation, KL divergence).

A trace keeps only each position's top predictions (``AttentionTrace.next_token_*``). The whole distribution at
one position is recomputed from the trace's last residual-stream vector through the family's final norm and
unembedding (``Family.unembed``): one vector, no second forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from model_core.analysis.predictions import unembed_residual
from model_core.trace.trace import AttentionTrace


def next_token_probs(family: Any, model: Any, trace: AttentionTrace, position: int = -1) -> np.ndarray:
    """The model's whole next-token distribution at ``position``, from the trace's last hidden state.

    Args:
        family: the model's adapter (``model_core.families``); it must be a decoder's.
        model: the loaded model the trace came from (``LoadedModel.model``).
        trace: a decoder's trace.
        position: the token whose next token is predicted; negative counts from the end.

    Raises:
        ValueError: the family predicts no tokens (an encoder), or the position is out of range.

    Shape: -> (vocab,) float64, sums to 1.
    """
    n = trace.n_tokens
    pos = position + n if position < 0 else position
    if not 0 <= pos < n:
        raise ValueError(f"position must be between {-n} and {n - 1}, got {position}.")
    logits = unembed_residual(family, model, trace, pos, layers=slice(-1, None))[0]  # the last layer: (vocab,)
    return torch.softmax(logits.double(), dim=-1).cpu().numpy()


@dataclass(frozen=True, eq=False)
class NextTokenEffect:
    """A decoder's next-token prediction at one position, with all heads on and with some switched off.

    Attributes:
        position: the token whose next token is predicted (the last one, by default).
        token_ids: the tokens either run ranks in its top predictions, best of the baseline first.
            Shape: (k,) int64.
        strings: their text. Shape: (k,).
        baseline: their probabilities with all heads on. Shape: (k,).
        masked: their probabilities with the heads switched off. Shape: (k,).
        total_variation: ½Σ|p − q| over the whole vocabulary (0 = the same distribution, 1 = disjoint).
        kl_bits: KL(baseline ‖ masked) over the whole vocabulary, in bits.
    """

    position: int
    token_ids: np.ndarray
    strings: tuple[str, ...]
    baseline: np.ndarray
    masked: np.ndarray
    total_variation: float
    kl_bits: float

    def __post_init__(self) -> None:
        k = len(self.token_ids)
        if len(self.strings) != k or self.baseline.shape != (k,) or self.masked.shape != (k,):
            raise ValueError("token_ids, strings, baseline and masked must have the same length.")

    @property
    def delta(self) -> np.ndarray:
        """Masked minus baseline probability of each listed token. Shape: (k,)."""
        return self.masked - self.baseline

    @property
    def top_changed(self) -> bool:
        """Whether the most likely next token changed."""
        return int(np.argmax(self.baseline)) != int(np.argmax(self.masked))

    @property
    def top_baseline(self) -> str:
        return self.strings[int(np.argmax(self.baseline))]

    @property
    def top_masked(self) -> str:
        return self.strings[int(np.argmax(self.masked))]

    def to_rows(self) -> list[dict[str, Any]]:
        """One dict per listed token, for a table or a CSV."""
        return [{"token": s, "id": int(i), "all heads on": float(b), "heads switched off": float(m),
                 "change": float(m - b)}
                for s, i, b, m in zip(self.strings, self.token_ids, self.baseline, self.masked)]


def _predicts(run: Any) -> bool:
    return getattr(run, "next_token_ids", None) is not None or getattr(run, "top_ids", None) is not None


def _top(run: Any, pos: int) -> tuple[Any, Any]:
    """A run's top next tokens at ``pos``: a trace keeps them at every position, a ``MaskedRun`` at its last."""
    if getattr(run, "next_token_ids", None) is not None:
        return run.next_token_ids[pos], run.next_token_strings[pos]
    if pos != run.n_tokens - 1:
        raise ValueError("A masked run keeps its predictions at the last token only; compare position -1.")
    return run.top_ids, run.top_strings


def next_token_effect(baseline: AttentionTrace, masked: Any, baseline_probs: np.ndarray,
                      masked_probs: np.ndarray, position: int = -1) -> NextTokenEffect:
    """Compare two runs' next-token predictions at ``position``.

    Args:
        baseline: the decoder's trace with all heads on.
        masked: the same input with some heads switched off (a trace, or a ``MaskedRun``).
        baseline_probs: the baseline's whole distribution at ``position`` (``next_token_probs``).
        masked_probs: the masked run's.
        position: the predicting token; negative counts from the end.

    Raises:
        ValueError: a trace has no next-token predictions (an encoder's), or the two differ in input or vocabulary.
    """
    if baseline.next_token_ids is None or not _predicts(masked):
        raise ValueError("Only a decoder's trace has next-token predictions; compare an encoder's hidden states "
                         "with compare_masking.")
    if baseline.tokens != masked.tokens:
        raise ValueError("Compare two traces of the same input; only head_mask may differ.")
    p = np.asarray(baseline_probs, dtype=np.float64)
    q = np.asarray(masked_probs, dtype=np.float64)
    if p.shape != q.shape or p.ndim != 1:
        raise ValueError(f"The two distributions must be (vocab,) of one size, got {p.shape} and {q.shape}.")
    n = baseline.n_tokens
    pos = position + n if position < 0 else position
    if not 0 <= pos < n:
        raise ValueError(f"position must be between {-n} and {n - 1}, got {position}.")
    names: dict[int, str] = {}
    for ids, strings in (_top(masked, pos), _top(baseline, pos)):  # the baseline's spelling wins where both have one
        names |= {int(i): s for i, s in zip(ids, strings)}
    ids = np.array(sorted(names, key=lambda i: (-p[i], -q[i], i)), dtype=np.int64)
    safe_q = np.where(q > 0, q, np.finfo(np.float64).tiny)  # a probability of exactly 0 stays finite in the log
    kl = float(np.sum(np.where(p > 0, p * np.log2(np.where(p > 0, p, 1.0) / safe_q), 0.0)))
    return NextTokenEffect(position=pos, token_ids=ids, strings=tuple(names[int(i)] for i in ids),
                           baseline=p[ids], masked=q[ids], total_variation=float(0.5 * np.abs(p - q).sum()),
                           kl_bits=max(kl, 0.0))
