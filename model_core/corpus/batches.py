"""One shard's work: tokenise texts, pack them into padded length-sorted batches, keep each text's statistics.

``process_chunk`` is the pure per-shard function both engines call (locally, or in a Ray worker).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from model_core.corpus.model import LoadedCorpusModel
from model_core.corpus.stats import N_STATS, BatchMasks, batch_head_stats
from model_core.settings import CHARS_PER_TOKEN_BOUND
from model_core.families.encoding import clean_text
from model_core.gate import GATE
from model_core.families import Family

LongPolicy = Literal["truncate", "skip"]
DEFAULT_CELL_BUDGET = 2**25
"""Attention cells per batch, batch x pos² x layer x head: 33.5M, about 134 MB per float32 copy."""


@dataclass(frozen=True)
class EncodedText:
    """One tokenised text. ``ids``/``types`` are plain lists (cheap to sort and pad)."""

    text_id: int
    ids: list[int]
    types: list[int]
    is_pair: bool
    truncated: bool


@dataclass(frozen=True)
class ChunkResult:
    """Each text's statistics for one shard, in text-id order.

    Shape: stats (text, stat, layer, head) float32 (NaN for skipped texts); the rest (text,).
    """

    index: int
    text_ids: np.ndarray
    n_tokens: np.ndarray
    truncated: np.ndarray
    skipped: np.ndarray
    stats: np.ndarray
    seconds: float = 0.0
    # The shard's rows of the token sample and their vectors, float16 (see model_core.corpus.sample).
    # Shape: sample_rows (row,); queries/keys (layer, row, hidden); hidden (layer + 1, row, hidden).
    sample_rows: np.ndarray | None = None
    queries: np.ndarray | None = None
    keys: np.ndarray | None = None
    hidden: np.ndarray | None = None


def encode_texts(tokenizer, texts: list[tuple[str, str | None]], first_id: int, max_tokens: int,
                 long: LongPolicy, family: Family | None = None) -> tuple[list[EncodedText], list[tuple[int, int]]]:
    """Tokenise a shard as the model family reads one text (``Family.encode``): [CLS] A [SEP] (B [SEP]) for an
    encoder, batched; a decoder's pair is A, a line break, then B.

    Returns:
        The texts to run, and (text id, length) of the texts skipped for being longer than
        ``max_tokens`` (with ``long="skip"``; with ``"truncate"`` they are cut and flagged).
    """
    if family is not None and family.is_decoder:
        return _encode_decoder_texts(tokenizer, texts, first_id, max_tokens, long, family)
    cleaned = [(clean_text(a) or "[UNK]", clean_text(b) or None) for a, b in texts]
    singles = [i for i, (_, b) in enumerate(cleaned) if b is None]
    pairs = [i for i, (_, b) in enumerate(cleaned) if b is not None]
    encoded: dict[int, tuple[list[int], list[int]]] = {}
    for group, args in ((singles, lambda idx: ([cleaned[i][0] for i in idx],)),
                        (pairs, lambda idx: ([cleaned[i][0] for i in idx], [cleaned[i][1] for i in idx]))):
        if not group:
            continue
        out = tokenizer(*args(group), add_special_tokens=True, truncation=False, verbose=False)
        types = out.get("token_type_ids") or [[0] * len(x) for x in out["input_ids"]]
        for i, ids, t in zip(group, out["input_ids"], types):
            encoded[i] = (ids, t)
    result, skipped = [], []
    for i, (a, b) in enumerate(cleaned):
        ids, types = encoded[i]
        truncated = False
        if len(ids) > max_tokens:
            if long == "skip":
                skipped.append((first_id + i, len(ids)))
                continue
            cut = tokenizer(a, b, add_special_tokens=True, truncation=True, max_length=max_tokens)
            ids, types = cut["input_ids"], cut.get("token_type_ids") or [0] * len(cut["input_ids"])
            truncated = True
        result.append(EncodedText(first_id + i, ids, types, b is not None, truncated))
    return result, skipped


def _encode_decoder_texts(tokenizer, texts: list[tuple[str, str | None]], first_id: int, max_tokens: int,
                          long: LongPolicy, family: Family) -> tuple[list[EncodedText], list[tuple[int, int]]]:
    result, skipped = [], []
    for i, (a, b) in enumerate(texts):
        # at most CHARS_PER_TOKEN_BOUND characters a token: a corpus text past that is over the token limit anyway
        cut = CHARS_PER_TOKEN_BOUND * max_tokens
        a = clean_text(a)[:cut] or (tokenizer.unk_token or "?")
        b = clean_text(b)[:cut]
        full = family.encode(tokenizer, a, b, max_tokens=10**9)
        n = full.input_ids.shape[1]
        if n > max_tokens and long == "skip":
            skipped.append((first_id + i, n))
            continue
        enc = full if n <= max_tokens else family.encode(tokenizer, a, b, max_tokens=max_tokens, truncate=True)
        result.append(EncodedText(first_id + i, enc.input_ids[0].tolist(), enc.token_type_ids[0].tolist(),
                                  bool(b), n > max_tokens))
    return result, skipped


def largest_batch(batch_size: int, tokens: int, n_heads_total: int, cell_budget: int = DEFAULT_CELL_BUDGET) -> int:
    """How many texts of ``tokens`` tokens ``plan_batches`` puts in one batch: ``batch_size`` at most, within
    ``cell_budget`` attention cells, one at least (what a run's memory estimate counts)."""
    return max(1, min(batch_size, cell_budget // max(1, tokens * tokens * n_heads_total)))


def plan_batches(texts: list[EncodedText], batch_size: int, n_heads_total: int,
                 cell_budget: int = DEFAULT_CELL_BUDGET) -> list[list[EncodedText]]:
    """Sort by length and pack batches of at most ``batch_size`` texts and ``cell_budget`` attention cells.

    Sorting keeps padding small; the cell budget keeps a batch of long texts from holding gigabytes
    of attention weights (every layer's weights are alive at once).
    """
    ordered = sorted(texts, key=lambda t: len(t.ids))
    batches: list[list[EncodedText]] = []
    current: list[EncodedText] = []
    for text in ordered:
        longest = len(text.ids)  # sorted: the newest text is the longest
        if current and (len(current) >= batch_size or (len(current) + 1) * longest**2 * n_heads_total > cell_budget):
            batches.append(current)
            current = []
        current.append(text)
    if current:
        batches.append(current)
    return batches


def pad_batch(batch: list[EncodedText], pad_id: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """(input_ids, token_type_ids, attention_mask, is_pair), padded on the right, on ``device``.

    Shape: (batch, pos) each, is_pair (batch,).
    """
    n = max(len(t.ids) for t in batch)
    ids = torch.full((len(batch), n), pad_id, dtype=torch.long)
    types = torch.zeros((len(batch), n), dtype=torch.long)
    mask = torch.zeros((len(batch), n), dtype=torch.long)
    for row, t in enumerate(batch):
        ids[row, : len(t.ids)] = torch.tensor(t.ids)
        types[row, : len(t.types)] = torch.tensor(t.types)
        mask[row, : len(t.ids)] = 1
    is_pair = torch.tensor([t.is_pair for t in batch])
    return ids.to(device), types.to(device), mask.to(device), is_pair.to(device)


SampleRows = dict[int, tuple[np.ndarray, np.ndarray]]  # text id -> (positions, sample rows)


def batch_stats(model: LoadedCorpusModel, batch: list[EncodedText], sample: SampleRows | None = None,
                qk: bool = False, hidden: bool = False) -> tuple[np.ndarray, dict[str, np.ndarray] | None]:
    """Run one padded batch: its texts' statistics, and the vectors of its sampled tokens.

    Shape: -> (text, stat, layer, head); vectors as ``ChunkResult``'s (with "rows").
    """
    ids, types, mask, is_pair = pad_batch(batch, model.tokenizer.pad_token_id or 0, model.device)
    masks = BatchMasks.build(ids, types, mask, model.classes, is_pair)
    wanted = [(b, *sample[t.text_id]) for b, t in enumerate(batch) if sample and t.text_id in sample]
    weights, vectors = model.forward(ids, types, mask, qk=qk and bool(wanted), hidden=hidden and bool(wanted))
    per_layer = [batch_head_stats(w, masks) for w in weights]  # (B, H, S) each
    stats = torch.stack(per_layer, dim=1)  # (B, L, H, S)
    out = stats.permute(0, 3, 1, 2).to("cpu", torch.float32).numpy()  # (B, S, L, H)
    if not wanted:
        return out, None
    b_idx = torch.tensor(np.concatenate([np.full(len(p), b) for b, p, _ in wanted]), device=model.device)
    p_idx = torch.tensor(np.concatenate([p for _, p, _ in wanted]), device=model.device)

    def gather(layers: list[torch.Tensor] | None) -> np.ndarray | None:
        if layers is None:
            return None
        return torch.stack([x[b_idx, p_idx] for x in layers]).to("cpu", torch.float16).numpy()  # (layer, row, hidden)

    picked = {"rows": np.concatenate([r for _, _, r in wanted]), "queries": gather(vectors.queries),
              "keys": gather(vectors.keys), "hidden": gather(vectors.hidden)}
    return out, picked


def shard_texts(model: LoadedCorpusModel, texts: list[tuple[str, str | None]], first_id: int, max_tokens: int,
                long: LongPolicy) -> tuple[list[EncodedText], np.ndarray, np.ndarray, np.ndarray]:
    """A shard's texts tokenised within ``max_tokens`` (and the model's positions), and per text its token count,
    whether it was truncated (filled in by the caller as its batches run), whether it was skipped (a skipped text's
    count is its full length). Shape: (text,)."""
    limit = min(max_tokens, model.max_positions)
    encoded, skipped = encode_texts(model.tokenizer, texts, first_id, limit, long, model.family)
    n = len(texts)
    n_tokens = np.zeros(n, dtype=np.int32)
    truncated = np.zeros(n, dtype=bool)
    skip = np.zeros(n, dtype=bool)
    for text_id, length in skipped:
        skip[text_id - first_id] = True
        n_tokens[text_id - first_id] = length
    return encoded, n_tokens, truncated, skip


def process_chunk(model: LoadedCorpusModel, index: int, first_id: int, texts: list[tuple[str, str | None]], *,
                  batch_size: int = 64, max_tokens: int = 512, long: LongPolicy = "truncate",
                  cell_budget: int = DEFAULT_CELL_BUDGET,
                  on_batch: Callable[[int], None] | None = None,
                  sample: SampleRows | None = None, qk: bool = False, hidden: bool = False) -> ChunkResult:
    """Every statistic of every text of one shard (the unit both engines schedule and a run folder stores).

    ``on_batch(n)`` is called after each batch with the number of this shard's texts done so far.
    ``sample`` names this shard's sampled tokens; ``qk``/``hidden`` say which of their vectors to keep.
    """
    start = time.perf_counter()
    encoded, n_tokens, truncated, skip = shard_texts(model, texts, first_id, max_tokens, long)
    n = len(texts)
    stats = np.full((n, N_STATS, model.n_layers, model.n_heads), np.nan, dtype=np.float32)
    done = int(skip.sum())
    picked: list[dict[str, np.ndarray]] = []
    for batch in plan_batches(encoded, batch_size, model.n_layers * model.n_heads, cell_budget):
        rows = [t.text_id - first_id for t in batch]
        with GATE.turn():  # the pass and its numpy statistics, as one turn of the route's gate
            stats[rows], vectors = batch_stats(model, batch, sample, qk, hidden)
        if vectors is not None:
            picked.append(vectors)
        n_tokens[rows] = [len(t.ids) for t in batch]
        truncated[rows] = [t.truncated for t in batch]
        if on_batch is not None:
            done += len(batch)
            on_batch(done)
    joined: dict[str, np.ndarray | None] = {"rows": None, "queries": None, "keys": None, "hidden": None}
    if picked:
        for key in joined:
            parts = [v[key] for v in picked if v[key] is not None]
            joined[key] = np.concatenate(parts, axis=0 if key == "rows" else 1) if parts else None
    return ChunkResult(index, np.arange(first_id, first_id + n, dtype=np.int64), n_tokens, truncated, skip, stats,
                       time.perf_counter() - start, joined["rows"], joined["queries"], joined["keys"], joined["hidden"])
