"""What a decoder predicts: its next-token predictions at every position, and the logit lens through its layers.

The logit lens (nostalgebraist, 2020, "interpreting GPT: the logit lens") reads the residual stream after every
layer as if it were the last: the model's own final norm and unembedding turn it into a distribution over the
vocabulary. Early layers' guesses, and the layer where the final prediction takes the lead, show how the answer
forms. The trace keeps the residual stream before the final norm (``AttentionTrace.hidden_states``), so the lens of
the last layer is exactly the model's prediction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from model_core.families.checks import require_decoder
from model_core.gate import GATE
from model_core.models.loading import LoadedModel
from model_core.trace.forward import top_tokens
from model_core.trace.trace import AttentionTrace
from model_core.trace.shape import freeze_arrays


def unembed_residual(family: Any, model: Any, trace: AttentionTrace, position: int,
                     layers: slice = slice(None)) -> torch.Tensor:
    """The family's final norm and unembedding applied to the trace's residual stream at ``position`` (the logit
    lens; the last layer's is the model's own next-token logits), for the chosen ``layers`` (default: all).

    Shape: -> (layer, vocab).
    """
    param = next(model.parameters())
    hidden = torch.from_numpy(np.array(trace.hidden_states[layers, position]))  # a writable copy of read-only rows
    with GATE.turn(), torch.inference_mode():  # the model's final norm and unembedding run here
        return family.unembed(model, hidden.to(device=param.device, dtype=param.dtype))


def _require_predictions(trace: AttentionTrace) -> None:
    require_decoder(trace.family, "reading next-token predictions")
    if trace.next_token_ids is None:
        raise ValueError("This trace kept no next-token predictions; trace the text again with its model.")


def _check_position(trace: AttentionTrace, position: int) -> int:
    if isinstance(position, bool) or not isinstance(position, (int, np.integer)):
        raise ValueError(f"position must be a whole number, got {position!r}.")
    if not 0 <= position < trace.n_tokens:
        raise ValueError(f"Position {position} is outside this input: pick one from 0 to {trace.n_tokens - 1}.")
    return int(position)


def next_token_rows(trace: AttentionTrace) -> list[dict[str, Any]]:
    """The trace's next-token predictions as long rows, one per (position, rank), for a CSV.

    Each row: ``position``, ``token`` (the input token there), ``rank`` (1 = the model's top prediction),
    ``predicted`` (its text), ``predicted_id`` and ``probability``.

    Raises:
        ValueError: the trace is an encoder's (no predictions).
    """
    _require_predictions(trace)
    rows = []
    for pos, token in enumerate(trace.tokens):
        for rank, (tid, prob, text) in enumerate(zip(trace.next_token_ids[pos], trace.next_token_probs[pos],
                                                     trace.next_token_strings[pos]), start=1):
            rows.append({"position": pos, "token": token, "rank": rank, "predicted": text,
                         "predicted_id": int(tid), "probability": np.float32(prob)})
    return rows


def actual_next_ranks(trace: AttentionTrace) -> list[int | None]:
    """For each position, the rank (1 = top) among the trace's kept predictions of the token that actually comes
    next in the input; None where it is not among them, and for the last position (nothing follows).

    Raises:
        ValueError: the trace is an encoder's.
    """
    _require_predictions(trace)
    ranks: list[int | None] = []
    for pos in range(trace.n_tokens):
        if pos + 1 == trace.n_tokens:
            ranks.append(None)
            continue
        hits = np.flatnonzero(trace.next_token_ids[pos] == trace.token_ids[pos + 1])
        ranks.append(int(hits[0]) + 1 if hits.size else None)
    return ranks


@dataclass(frozen=True, eq=False)
class LogitLens:
    """The logit lens at one position: every layer's residual stream read through the final norm and unembedding.

    Row 0 is the embeddings, row i the output of layer i - 1; the last row is the model's own prediction.

    Attributes:
        position: the input position read.
        token: the input token there.
        top_ids: each row's k most probable next tokens, best first. Shape: (layer + 1, k) int64.
        top_probs: their probabilities. Shape: (layer + 1, k) float32.
        top_strings: their text. Shape: (layer + 1, k) as nested tuples.
        final_id: the model's final top-1 token (the last row's best).
        final_string: its text.
        final_probs: the probability each row gives it. Shape: (layer + 1,) float32.
        final_ranks: its rank in each row, 1 = top. Shape: (layer + 1,) int64.
    """

    position: int
    token: str
    top_ids: np.ndarray
    top_probs: np.ndarray
    top_strings: tuple[tuple[str, ...], ...]
    final_id: int
    final_string: str
    final_probs: np.ndarray
    final_ranks: np.ndarray

    def __post_init__(self) -> None:
        rows, k = self.top_ids.shape
        assert self.top_probs.shape == (rows, k) and len(self.top_strings) == rows
        assert self.final_probs.shape == (rows,) == self.final_ranks.shape
        freeze_arrays(self)

    @property
    def n_rows(self) -> int:
        """Layers + 1 (the embeddings first)."""
        return int(self.top_ids.shape[0])

    @property
    def k(self) -> int:
        return int(self.top_ids.shape[1])

    @property
    def row_labels(self) -> tuple[str, ...]:
        """"embeddings", then "layer 0", "layer 1", … (the output of each layer)."""
        return ("embeddings", *(f"layer {i}" for i in range(self.n_rows - 1)))

    def to_rows(self) -> list[dict[str, Any]]:
        """Long rows for a CSV: one per (layer, rank), with the final prediction's probability and rank there."""
        rows = []
        for r, label in enumerate(self.row_labels):
            for rank in range(self.k):
                rows.append({"position": self.position, "token": self.token, "layer": label, "rank": rank + 1,
                             "predicted": self.top_strings[r][rank], "predicted_id": int(self.top_ids[r, rank]),
                             "probability": self.top_probs[r, rank], "final_prediction": self.final_string,
                             "final_probability": self.final_probs[r], "final_rank": int(self.final_ranks[r])})
        return rows


@torch.inference_mode()
def logit_lens(loaded: LoadedModel, trace: AttentionTrace, position: int, k: int = 5) -> LogitLens:
    """The logit lens at ``position``: ``loaded.family.unembed`` applied to the residual stream after every layer.

    Args:
        loaded: the decoder that produced ``trace`` (its final norm and unembedding are applied).
        trace: a decoder's trace; its ``hidden_states`` are read.
        position: the input position whose next-token guesses are read.
        k: how many of each layer's most probable tokens to keep.

    Raises:
        ValueError: an encoder (model or trace), a model that did not produce this trace, or a bad position or k.
    """
    family = loaded.family
    require_decoder(trace.family, "the logit lens")
    require_decoder(family, "the logit lens")
    config = loaded.model.config
    expected = (family.n_layers(config) + 1, trace.n_tokens, int(config.hidden_size))
    if family.name != trace.model_kind or trace.hidden_states.shape != expected:
        raise ValueError(f"This trace (hidden states {trace.hidden_states.shape}) was not made by "
                         f"{loaded.source.model_id}; pass the model that traced it.")
    position = _check_position(trace, position)
    vocab = int(loaded.model.get_output_embeddings().weight.shape[0])
    if not 1 <= k <= vocab:
        raise ValueError(f"k must be between 1 and the vocabulary size ({vocab}), got {k}.")
    logits = unembed_residual(family, loaded.model, trace, position)  # (layer + 1, vocab)
    probs = torch.softmax(logits.float(), dim=-1)
    ids, top_probs, strings = top_tokens(probs, k, loaded.tokenizer)  # (layer + 1, k) each
    final_id = int(ids[-1, 0])
    final_probs = probs[:, final_id]  # (layer + 1,)
    final_ranks = (probs > final_probs[:, None]).sum(dim=-1) + 1  # 1 + how many tokens beat it in each row
    return LogitLens(
        position=position,
        token=trace.tokens[position],
        top_ids=ids,
        top_probs=top_probs.astype(np.float32),
        top_strings=strings,
        final_id=final_id,
        final_string=loaded.tokenizer.decode([final_id]),
        final_probs=final_probs.cpu().numpy().astype(np.float32),
        final_ranks=final_ranks.cpu().numpy().astype(np.int64),
    )
