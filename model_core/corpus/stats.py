"""Clark et al.'s head statistics for a padded batch, sums that merge across shards, and pattern types.

The batched statistics are the same numbers as ``model_core.analysis.head_stats`` computes for one
text (a test compares them), but for many texts at once, on the model's device, from the attention
weights of a padded batch. ``StatSums`` keeps sums, sums of squares and counts, so shards computed
anywhere merge exactly into the corpus mean and standard deviation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from model_core.analysis._common import CLS_TOKENS, SEP_TOKENS, is_punctuation, is_special
from model_core.analysis.per_head import STAT_NAMES

N_STATS = len(STAT_NAMES)
_IDX = {name: i for i, name in enumerate(STAT_NAMES)}


@dataclass(frozen=True)
class TokenClasses:
    """Per-vocabulary-id flags, looked up for a whole batch at once.

    Shape: each (vocab,) bool.
    """

    cls: np.ndarray
    sep: np.ndarray
    special: np.ndarray
    punct: np.ndarray
    first_token: bool = False
    """A decoder's: the "cls" share is the share to position 0 (the first token), whatever it is."""

    @classmethod
    def from_tokenizer(cls, tokenizer, first_token: bool = False) -> "TokenClasses":
        """Classify every token of ``tokenizer``'s vocabulary once (30k WordPieces: ~20 ms)."""
        vocab = tokenizer.get_vocab()
        size = max(max(vocab.values()) + 1, len(tokenizer))
        specials = set(getattr(tokenizer, "all_special_tokens", ()))
        flags = {name: np.zeros(size, dtype=bool) for name in ("cls", "sep", "special", "punct")}
        for token, index in vocab.items():
            special = is_special(token) or token in specials
            flags["cls"][index] = token in CLS_TOKENS and not first_token
            # a decoder's "sep" share is to its special tokens after position 0 (as analysis.trace_flags)
            flags["sep"][index] = special if first_token else token in SEP_TOKENS
            flags["special"][index] = special
            flags["punct"][index] = is_punctuation(token) and not special
        return cls(**flags, first_token=first_token)


@dataclass(frozen=True)
class BatchMasks:
    """The masks the statistics need for one padded batch, on the model's device.

    Shape: each (batch, pos) float32 (1 or 0), except ``lengths`` (batch,) float32.
    """

    valid: torch.Tensor
    keys: torch.Tensor  # (batch, pos, 5): cls, sep, punct, words of A, words of B
    words_a: torch.Tensor
    words_b: torch.Tensor
    lengths: torch.Tensor

    @classmethod
    def build(cls, input_ids: torch.Tensor, token_type_ids: torch.Tensor, attention_mask: torch.Tensor,
              classes: TokenClasses, is_pair: torch.Tensor) -> "BatchMasks":
        """Masks of a padded batch. ``is_pair`` (batch,) bool marks the sentence pairs."""
        ids = input_ids.cpu().numpy()
        device = input_ids.device
        look = lambda table: torch.from_numpy(table[ids]).to(device, torch.float32)  # noqa: E731
        valid = attention_mask.to(torch.float32)
        special = look(classes.special)
        first, sep = look(classes.cls) * valid, look(classes.sep) * valid
        if classes.first_token:  # a decoder: position 0, whatever it is, and the specials after it
            first = torch.zeros_like(valid)
            first[:, 0] = valid[:, 0]
            sep = sep * (1 - first)
            special = torch.maximum(special, first)  # its first token is its sink, not a word of A
        words = valid * (1 - special) * is_pair.to(device, torch.float32)[:, None]
        types = token_type_ids.to(torch.float32)
        words_a, words_b = words * (1 - types), words * types
        keys = torch.stack([first, sep, look(classes.punct) * valid,
                            words_a, words_b], dim=-1)
        return cls(valid=valid, keys=keys, words_a=words_a, words_b=words_b, lengths=valid.sum(-1))


def batch_head_stats(weights: torch.Tensor, masks: BatchMasks) -> torch.Tensor:
    """Every statistic of ``STAT_NAMES`` for one layer of a padded batch.

    Padded keys carry zero weight after the softmax, so sums over keys need no mask; means over
    queries count only real tokens. A text with no sentence B (or no word in A or B) gets NaN for
    ``a_to_b`` and ``b_to_a``, as the one-text statistics do.

    Args:
        weights: attention weights of one layer. Shape: (batch, head, q_pos, k_pos).
        masks: the batch's masks.

    Shape: -> (batch, head, stat), float32.
    """
    w = weights.to(torch.float32)
    valid = masks.valid[:, None, :]  # (B, 1, q_pos)
    n = masks.lengths[:, None]  # (B, 1)

    def query_mean(per_query: torch.Tensor, where: torch.Tensor = valid, count: torch.Tensor = n) -> torch.Tensor:
        return (per_query * where).sum(-1) / count

    # 0·log 0 = 0: log of 1 where the weight is 0 (padding, masked keys).
    entropy = -(w * torch.log2(torch.where(w > 0, w, torch.ones_like(w)))).sum(-1)  # (B, H, q_pos)
    to_keys = torch.matmul(w, masks.keys[:, None])  # (B, H, q_pos, 5)
    diag = torch.diagonal(w, dim1=-2, dim2=-1)  # (B, H, pos)
    prev = torch.diagonal(w, offset=-1, dim1=-2, dim2=-1)  # (B, H, pos-1): α_i,i-1 for i >= 1
    nxt = torch.diagonal(w, offset=1, dim1=-2, dim2=-1)  # (B, H, pos-1): α_i,i+1 for i <= n-2
    pairs = valid[..., 1:]  # the pair (i-1, i) is real when i is real
    n_a = masks.words_a.sum(-1)[:, None]
    n_b = masks.words_b.sum(-1)[:, None]
    nan = torch.tensor(float("nan"), device=w.device)
    a_to_b = torch.where(n_a * n_b > 0, query_mean(to_keys[..., 4], masks.words_a[:, None], n_a.clamp_min(1)), nan)
    b_to_a = torch.where(n_a * n_b > 0, query_mean(to_keys[..., 3], masks.words_b[:, None], n_b.clamp_min(1)), nan)
    stats = {
        "entropy": query_mean(entropy),
        "to_cls": query_mean(to_keys[..., 0]),
        # no [SEP]-like token in the text (a decoder's plain text): undefined, as the one-text statistics say
        "to_sep": torch.where(masks.keys[..., 1].sum(-1)[:, None] > 0, query_mean(to_keys[..., 1]), nan),
        "to_punct": query_mean(to_keys[..., 2]),
        "to_self": query_mean(diag),
        "to_prev": query_mean(prev, pairs, (n - 1).clamp_min(1)),
        "to_next": query_mean(nxt, pairs, (n - 1).clamp_min(1)),
        "a_to_b": a_to_b,
        "b_to_a": b_to_a,
    }
    return torch.stack([stats[name] for name in STAT_NAMES], dim=-1)


@dataclass
class StatSums:
    """Sufficient statistics of per-text head statistics: counts, sums and sums of squares.

    NaN values (e.g. A→B of a single sentence) are left out of their statistic's count. Adding texts
    in any grouping and merging the sums gives the same mean and standard deviation (up to float64
    rounding), which is what lets shards run anywhere.

    Shape: count, total, total_sq: (stat, layer, head) float64.
    """

    count: np.ndarray
    total: np.ndarray
    total_sq: np.ndarray
    n_texts: int = 0

    @classmethod
    def zeros(cls, n_layers: int, n_heads: int) -> "StatSums":
        shape = (N_STATS, n_layers, n_heads)
        return cls(np.zeros(shape), np.zeros(shape), np.zeros(shape), 0)

    def add(self, per_text: np.ndarray) -> None:
        """Add texts' statistics. Shape: per_text (text, stat, layer, head)."""
        values = np.asarray(per_text, dtype=np.float64)
        finite = np.isfinite(values)
        clean = np.where(finite, values, 0.0)
        self.count += finite.sum(0)
        self.total += clean.sum(0)
        self.total_sq += (clean * clean).sum(0)
        self.n_texts += int(values.shape[0])

    def merge(self, other: "StatSums") -> "StatSums":
        """The sums of both shards (a new object)."""
        if self.count.shape != other.count.shape:
            raise ValueError(f"Cannot merge statistics of shape {other.count.shape} into {self.count.shape}: "
                             "the shards come from different models.")
        return StatSums(self.count + other.count, self.total + other.total, self.total_sq + other.total_sq,
                        self.n_texts + other.n_texts)

    def mean(self) -> np.ndarray:
        """Mean over texts, each text weighted equally; NaN where no text defines it. Shape: (stat, layer, head)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.count > 0, self.total / np.maximum(self.count, 1), np.nan)

    def std(self) -> np.ndarray:
        """Population standard deviation over texts (ddof=0). Shape: (stat, layer, head)."""
        mean = self.mean()
        with np.errstate(invalid="ignore"):
            var = self.total_sq / np.maximum(self.count, 1) - mean * mean
        return np.where(self.count > 0, np.sqrt(np.clip(var, 0.0, None)), np.nan)


# -- pattern types --------------------------------------------------------------------------------------
PATTERN_TYPES = ("vertical", "diagonal", "block", "heterogeneous")


@dataclass(frozen=True)
class PatternRules:
    """Thresholds of the pattern-type heuristic, after Kovaleva et al. (2019), "Revealing the Dark
    Secrets of BERT". The rules are tried in order; the first that holds names the head.

    1. **vertical**: mean share to [CLS] + [SEP] + punctuation ≥ ``vertical``: most queries look at
       the same few marker tokens (a vertical stripe in the heatmap).
    2. **diagonal**: mean share to the previous token + itself + the next token ≥ ``diagonal``.
    3. **block**: in sentence pairs, the mean share a word gives to the other sentence (A→B and B→A,
       averaged) ≤ ``block``: words stay inside their own sentence. Needs pairs in the corpus.
    4. **heterogeneous**: none of the above.

    Kovaleva et al. labelled heatmaps by hand and trained a classifier; these are thresholds on
    corpus means, a heuristic that agrees with their descriptions, not their classifier.
    """

    vertical: float = 0.5
    diagonal: float = 0.5
    block: float = 0.1

    def __post_init__(self) -> None:
        for name in ("vertical", "diagonal", "block"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"The {name} threshold must be between 0 and 1.")

    def describe(self) -> list[tuple[str, str]]:
        """(type, rule) rows for a table on the page."""
        return [
            ("vertical", f"share to the first token ([CLS] in an encoder) + the special tokens ([SEP]) + "
                         f"punctuation ≥ {self.vertical:g}"),
            ("diagonal", f"share to previous + self + next token ≥ {self.diagonal:g}"),
            ("block", f"pairs only: share to the other sentence (mean of A→B, B→A) ≤ {self.block:g}"),
            ("heterogeneous", "none of the above"),
        ]


def pattern_types(mean: np.ndarray, rules: PatternRules = PatternRules()) -> np.ndarray:
    """The pattern type of every head from the corpus means.

    Args:
        mean: corpus means. Shape: (stat, layer, head).

    Shape: -> (layer, head), strings from ``PATTERN_TYPES``.
    """
    m = {name: np.nan_to_num(mean[i], nan=0.0) for name, i in _IDX.items()}
    vertical = m["to_cls"] + m["to_sep"] + m["to_punct"] >= rules.vertical
    diagonal = m["to_prev"] + m["to_self"] + m["to_next"] >= rules.diagonal
    cross = 0.5 * (mean[_IDX["a_to_b"]] + mean[_IDX["b_to_a"]])  # NaN where the corpus has no pairs
    block = np.isfinite(cross) & (np.nan_to_num(cross, nan=1.0) <= rules.block)
    out = np.full(mean.shape[1:], "heterogeneous", dtype=object)
    out[block] = "block"
    out[diagonal] = "diagonal"
    out[vertical] = "vertical"
    return out.astype(str)
