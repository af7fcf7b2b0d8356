"""The probe inputs and ``score_roles``: every head's previous-token, duplicate-token, induction and sink score.

Protocol (Olsson et al., 2022, "In-context Learning and Induction Heads"; TransformerLens's ``head_detector``
for previous- and duplicate-token heads; Xiao et al., 2023, "Efficient Streaming Language Models with Attention
Sinks", for the sink):

- ``n_sequences`` (4) sequences of ``seq_len`` (50) distinct random words, each sequence written twice, one
  text per sequence: "w1 … w50 w1 … w50". The words are whole-word tokens of the model's own vocabulary that
  the tokenizer reads back as one token after a space, drawn with ``numpy.random.default_rng(seed)``. Words,
  not arbitrary token ids, so that the probe input is a text: the heatmaps page opens exactly the input that
  earned a score. (A BPE tokenizer reads the text's first word without its leading space, another token: that
  one query finds no earlier copy and does not count.)
- The texts run as one padded batch through the family's one forward pass (``Family.forward``, the pass every
  trace and corpus batch takes), keeping only the weights.
- Per text, ``model_core.roles.scores.role_scores``; the score of a head is the mean over the texts.
  Previous-token counts every query with a previous token; sink every query; duplicate-token every word
  whose token occurs elsewhere among the keys it sees; induction every word of the second copy whose token
  occurred earlier, weighing the key just after that earlier occurrence.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from model_core.analysis._common import is_special
from model_core.corpus.model import CorpusModel, LoadedCorpusModel
from model_core.gate import GATE
from model_core.models.run_memory import (
    check_run_memory,
    device_of,
    model_shape,
    run_memory_limit_mb,
    trace_pass_bytes,
)
from model_core.roles.scores import PROBE_ROLES, RoleInput, role_scores
from model_core.trace.forward import to_host
from model_core.trace.request import Models, TraceRequest

N_SEQUENCES = 4
SEQ_LEN = 50
_WORD = re.compile(r"^(?:Ġ|▁)?([a-z]{3,9})$")

ROLE_TITLES: dict[str, str] = {
    "previous_token": "Previous-token",
    "duplicate_token": "Duplicate-token",
    "induction": "Induction",
    "sink": "Sink (first token)",
    "retrieval": "Retrieval",
}

ENCODER_NOTES: dict[str, str] = {
    "induction": "A bidirectional encoder also sees the token after itself, so a high score here means the head "
                 "looks at the token after the earlier copy of the current word, not that it predicts the next "
                 "token in context as a decoder's induction head does.",
    "retrieval": "Retrieval scores need a decoder that generates text (Wu et al. copy a needle into the "
                 "answer); an encoder generates nothing, so it has no retrieval score.",
}


def word_pool(tokenizer: Any) -> list[str]:
    """The vocabulary's lower-case whole words of 3-9 letters (a BPE word start "Ġ"/"▁" taken off), sorted.

    Raises:
        ValueError: the tokenizer has no vocabulary to list.
    """
    vocab = getattr(tokenizer, "get_vocab", dict)()
    if not vocab:
        raise ValueError("The tokenizer lists no vocabulary; the role probes draw their words from it.")
    return sorted({m.group(1) for token in vocab if (m := _WORD.match(token))})


def _one_token(tokenizer: Any, word: str) -> bool:
    return len(tokenizer(" " + word, add_special_tokens=False)["input_ids"]) == 1


def probe_texts(tokenizer: Any, seed: int, n_sequences: int = N_SEQUENCES, seq_len: int = SEQ_LEN) -> tuple[str, ...]:
    """The probe's texts: ``n_sequences`` sequences of ``seq_len`` distinct words drawn with ``seed``, each twice.

    Words come from ``word_pool`` in the order of a seeded permutation; a word the tokenizer does not read back
    as one token after a space is skipped.

    Raises:
        ValueError: the vocabulary has fewer than ``seq_len`` usable words, or a size is below 2.
    """
    if n_sequences < 1 or seq_len < 2:
        raise ValueError("The probe needs at least one sequence of at least 2 words.")
    pool = word_pool(tokenizer)
    if len(pool) < seq_len:
        raise ValueError(f"The tokenizer has {len(pool)} whole words; the probe needs {seq_len}. Lower seq_len.")
    rng = np.random.default_rng(seed)
    texts = []
    for _ in range(n_sequences):
        words: list[str] = []
        for i in rng.permutation(len(pool)):
            if _one_token(tokenizer, pool[i]):
                words.append(pool[i])
                if len(words) == seq_len:
                    break
        if len(words) < seq_len:
            raise ValueError(f"The tokenizer has {len(words)} one-token words; the probe needs {seq_len}. "
                             "Lower seq_len.")
        texts.append(" ".join(words + words))
    return tuple(texts)


def top_heads(grid: np.ndarray, k: int = 10) -> list[tuple[int, int, float]]:
    """The ``k`` highest-scoring (layer, head, score) of a role's grid, best first (ties in head order); heads where
    the score is undefined (NaN) are left out.

    Shape: grid (layer, head).
    """
    grid = np.asarray(grid, dtype=np.float64)
    order = np.argsort(np.nan_to_num(grid, nan=-np.inf).ravel(), kind="stable")[::-1]
    n_heads = grid.shape[1]
    return [(int(i // n_heads), int(i % n_heads), float(grid.ravel()[i]))
            for i in order[:k] if np.isfinite(grid.ravel()[i])]


@dataclass(frozen=True, eq=False)
class RoleScores:
    """Every head's score for each role, with what produced them.

    Attributes:
        scores: role -> (layer, head) float64; NaN where the role does not apply.
        notes: role -> a sentence on what the score means for this model, or why there is none.
        texts: the probe's input texts (one per sequence).
        seed: the seed that drew them.
        description: the model, in one line.
        is_decoder: whether the model is a causal language model.
    """

    scores: dict[str, np.ndarray]
    texts: tuple[str, ...]
    seed: int
    description: str
    is_decoder: bool
    notes: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        shapes = {np.shape(v) for v in self.scores.values()}
        if len(shapes) != 1 or len(next(iter(shapes))) != 2:
            raise ValueError("Every role's scores must be a (layer, head) array of one shape.")

    @property
    def shape(self) -> tuple[int, int]:
        """(layer, head)."""
        return next(iter(self.scores.values())).shape  # type: ignore[return-value]

    def top_heads(self, role: str, k: int = 10) -> list[tuple[int, int, float]]:
        """The ``k`` highest-scoring (layer, head, score) of ``role``, best first; none where it is undefined."""
        return top_heads(self.scores[role], k)

    def with_role(self, role: str, grid: np.ndarray, note: str | None = None) -> RoleScores:
        """A copy with one more role (e.g. retrieval, scored apart because it generates)."""
        notes = {**self.notes, **({role: note} if note else {})}
        return dataclasses.replace(self, scores={**self.scores, role: np.asarray(grid, dtype=np.float64)}, notes=notes)

    def to_rows(self) -> list[dict[str, float | int]]:
        """One dict per head (layer, head, then each role), for ``model_core.io.tables.rows_to_csv``."""
        n_layers, n_heads = self.shape
        return [{"layer": layer, "head": head, **{r: float(g[layer, head]) for r, g in self.scores.items()}}
                for layer in range(n_layers) for head in range(n_heads)]

    def to_json(self, k: int = 10) -> dict[str, Any]:
        """A JSON-able dict: per role its (layer, head) scores (null where undefined) and its top ``k`` heads."""
        grid = lambda g: [[None if not np.isfinite(v) else round(float(v), 6) for v in row] for row in g]
        return {
            "model": self.description, "seed": self.seed, "layers": self.shape[0], "heads": self.shape[1],
            "probe_texts": list(self.texts),
            "roles": {role: {"scores": grid(g), "note": self.notes.get(role, ""),
                             "top_heads": [{"layer": la, "head": h, "score": round(s, 6)}
                                           for la, h, s in self.top_heads(role, k)]}
                      for role, g in self.scores.items()},
        }


def probe_request(request: TraceRequest, text: str) -> TraceRequest:
    """The request's model on one probe text (no pair, no head switched off, no truncation): the trace the
    heatmaps page shows for a probe input."""
    return dataclasses.replace(request, text_a=text, text_b="", truncate=False, head_mask=None)


def probe_inputs(loaded: LoadedCorpusModel, texts: tuple[str, ...]) -> list[RoleInput]:
    """Run the texts as one right-padded batch through the family's one forward pass (``Family.forward``; no
    queries, keys or hidden states kept) and cut each text's weights out of the batch.

    Right padding changes nothing for the real tokens: a decoder's real tokens come first and never see the pads,
    and an encoder's mask hides them.
    """
    family, tokenizer = loaded.family, loaded.tokenizer
    encoded = [family.encode(tokenizer, t, max_tokens=loaded.max_positions) for t in texts]
    lengths = [len(e.tokens) for e in encoded]
    n = max(lengths)
    ids = torch.zeros(len(texts), n, dtype=torch.long)  # pad id 0: masked out, or after every real token
    types = torch.zeros_like(ids)
    attention_mask = torch.zeros_like(ids)
    for i, (e, m) in enumerate(zip(encoded, lengths)):
        ids[i, :m], types[i, :m], attention_mask[i, :m] = e.input_ids[0], e.token_type_ids[0], 1
    dev = loaded.device
    specials = family.special_tokens(tokenizer)
    inputs = []
    with GATE.turn():  # until the batch's weights are numpy: they are the pass's memory
        out = family.forward(loaded.module, ids.to(dev), types.to(dev), attention_mask.to(dev), vectors=False,
                             hidden=False)
        # the batch's weights (batch, layer, head, pos, pos) and masks come over together: one copy a dtype
        weights, masks = to_host([torch.stack(list(out.weights), 1), out.mask])
        del out
    host_ids = ids.numpy()  # built on the host: a view
    for i, (e, m) in enumerate(zip(encoded, lengths)):
        inputs.append(RoleInput(np.ascontiguousarray(weights[i, :, :, :m, :m]), host_ids[i, :m].copy(),
                                np.array([is_special(t, specials) for t in e.tokens]),
                                masks[i, :m, :m].astype(bool)))
    return inputs


def usable_words(tokenizer: Any) -> int:
    """How many words of ``word_pool`` the tokenizer reads back as one token (a small vocabulary's limit)."""
    return sum(_one_token(tokenizer, w) for w in word_pool(tokenizer))


def check_probe_memory(model: Any, n_sequences: int, tokens: int) -> None:
    """Refuse a probe whose traces (every sequence's weights, kept until scored) would pass ``AE_RUN_MEMORY_MB``.

    Raises:
        RunMemoryError (a ValueError): the estimate and the limit.
    """
    shape = model_shape(model)
    weights = 4.0 * (n_sequences - 1) * shape.n_layers * shape.n_heads * tokens * tokens
    check_run_memory(f"Head roles' probe of {n_sequences} sequences of about {tokens:,} tokens",
                     trace_pass_bytes(shape, 1, tokens) + weights, run_memory_limit_mb(device=device_of(model)),
                     "Use fewer or shorter sequences.")


def score_roles(request: TraceRequest, seed: int = 0, *, n_sequences: int = N_SEQUENCES, seq_len: int | None = None,
                models: Models | None = None, device: Any = None) -> RoleScores:
    """Score every head of the request's model for previous-token, duplicate-token, induction and sink heads.

    Args:
        request: the model (its text is ignored: the probe brings its own).
        seed: draws the probe's words.
        n_sequences, seq_len: the probe's size (see the module's protocol); ``seq_len`` None is ``SEQ_LEN``, or
            every usable word of a vocabulary with fewer (at least 8; a note says so).
        models: where the model comes from (default ``Models()``; the app passes its cached loaders).
        device: "cpu", "cuda"... (default: the settings').

    Raises:
        ValueError: the vocabulary has too few one-token words, or an option is out of range.
    """
    loaded = CorpusModel.from_request(request).load(device=device, models=models)
    notes: dict[str, str] = {}
    if seq_len is None:
        seq_len = SEQ_LEN
        if len(word_pool(loaded.tokenizer)) < 4 * SEQ_LEN and (usable := usable_words(loaded.tokenizer)) < SEQ_LEN:
            seq_len = max(usable, 8)
            notes["induction"] = (f"This vocabulary has only {usable} one-token words, so the probe's sequences "
                                  f"have {seq_len} words, not {SEQ_LEN}.")
    texts = probe_texts(loaded.tokenizer, seed, n_sequences, seq_len)
    check_probe_memory(loaded.module, n_sequences, 2 * seq_len + 2)
    sums: dict[str, np.ndarray] = {}
    inputs = probe_inputs(loaded, texts)
    for x in inputs:
        for role, grid in role_scores(x).items():
            sums[role] = sums.get(role, 0.0) + grid
    causal = all(not np.triu(x.mask, 1).any() for x in inputs)  # a decoder, or the custom encoder made causal
    if not causal:
        notes["induction"] = " ".join(filter(None, (notes.get("induction"), ENCODER_NOTES["induction"])))
    return RoleScores({role: sums[role] / len(texts) for role in PROBE_ROLES}, texts, seed, loaded.description,
                      loaded.family.is_decoder, notes)
