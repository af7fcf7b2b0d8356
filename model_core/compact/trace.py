"""Compact traces of long inputs: what any window of attention weights is made of, and no n x n weights.

An attention weight is ``exp(score - lse)``, where ``score`` is ``q·k`` times the model's scaling (Gemma 2 caps
it: ``cap·tanh(score / cap)``), masked, and ``lse`` is its row's log-sum-exp. A compact trace keeps, per layer and
head, the queries (after the rotary embedding), the key/value heads' keys, each row's ``lse``, exact block means
for an overview and the head statistics, computed as a stream over blocks of query rows. Any tile, row or column
of the weights is then exact at the cost of that tile alone (``CompactTrace.weights``), the forward pass runs
sdpa (no ``output_attentions``), and memory grows with the length, not its square. FlashAttention keeps the same
``softmax_lse``; MadryLab's AT2 recomputes attention rows from cached states the same way.

The file format (``save``/``load``) is an uncompressed NPZ; ``FIELDS`` documents every array in it.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from model_core.kernel import apply_mask, attention_scores, expand_kv, pair_scores, pair_weights, weights_from_scores
from model_core.trace.shape import TraceShape

FORMAT = "attention-explorer-compact"
VERSION = 1
QUERY_BLOCK = 256
"""Query rows per block: a block's scores are (head, QUERY_BLOCK, pos) floats, so the peak is O(pos), not O(pos²)."""
OVERVIEW_CELLS = 32
"""The overview has at most this many cells a side: ``pool`` = ceil(pos / OVERVIEW_CELLS) positions per cell."""
STAT_NAMES = ("entropy", "to_first", "to_self", "to_prev", "to_next", "mean_distance", "max_weight")

FIELDS = {
    "meta": "JSON: format, version, model_kind, description, causal, score_scale, score_softcap, pool, stat_names, "
            "dtype (the model's precision)",
    "tokens": "(pos,) str: the tokens",
    "token_ids": "(pos,) int64",
    "queries": "(layer, head, pos, d_head) float32: after the rotary embedding where the model has one",
    "keys": "(layer, kv_head, pos, d_head) float32: the key/value heads' keys, before grouped-query repetition",
    "kv_heads": "(head,) int64: the key/value head each query head reads",
    "lse": "(layer, head, pos) float64: each row's log-sum-exp of the masked scores",
    "masks": "(mask, pos, ceil(pos / 8)) uint8: np.packbits of each distinct mask (True = may attend), axis -1",
    "mask_of_layer": "(layer,) int64: which of `masks` each layer used (sliding-window layers differ)",
    "overview": "(layer, head, m, m) float32: exact block means (rows averaged, keys summed: rows sum to 1)",
    "stat_<name>": "(layer, head) float64: each head statistic, mean over the query rows (see STAT_NAMES)",
    "next_token_ids/probs": "(pos, k): a decoder's top next-token predictions at every position (optional)",
    "meta.reply_start": "where a generated reply starts (its first token), or absent/null for a typed-in text",
}


@dataclass(frozen=True, eq=False)
class LayerMask:
    """A layer's mask and what the summary asks of it, worked out once per distinct mask (layers of one kind share
    one; each check is a pass over n x n booleans)."""

    allowed: torch.Tensor  # (q_pos, k_pos) bool, True = may attend
    future: bool  # some query may see a later key (an encoder)
    causal: bool  # exactly the plain causal mask
    choosing: torch.Tensor  # (q_pos,) bool: the queries the largest weight is taken over (as head_stats)

    @classmethod
    def of(cls, allowed: torch.Tensor) -> LayerMask:
        tril = torch.ones_like(allowed).tril()
        future = bool((allowed & ~tril).any())
        choosing = allowed.sum(1) > 1  # a causal model's first query has no choice
        if not choosing.any():
            choosing[:] = True
        return cls(allowed, future, not future and bool(torch.equal(allowed, tril)), choosing)

    def to(self, device: torch.device | str) -> LayerMask:
        """The same mask with its tensors on ``device`` (a summary computed on an accelerator)."""
        return replace(self, allowed=self.allowed.to(device), choosing=self.choosing.to(device))


class CompactFormatError(ValueError):
    """A file that is not a compact trace of ours, or is truncated."""


@dataclass(frozen=True, eq=False)
class CompactTrace(TraceShape):
    """Everything needed to compute any window of a long input's attention weights exactly.

    Attributes:
        tokens: the tokens. token_ids: Shape: (pos,).
        queries: Shape: (layer, head, pos, d_head). keys: Shape: (layer, kv_head, pos, d_head).
        kv_heads: Shape: (head,). lse: Shape: (layer, head, pos).
        masks: distinct masks, True where a query may attend to a key. Shape: (mask, pos, pos) bool.
        mask_of_layer: Shape: (layer,). overview: exact block means. Shape: (layer, head, m, m).
        stats: name -> Shape: (layer, head).
        pool: positions per overview cell.
        reply_start: where a generated reply starts (its first token's position), or None for a typed-in text.
        dtype: the precision the model ran in ("float32", "bfloat16", "float16"; AE_DTYPE); the arrays are float32
            (``lse`` float64) either way.
    """

    tokens: tuple[str, ...]
    token_ids: np.ndarray
    queries: np.ndarray
    keys: np.ndarray
    kv_heads: np.ndarray
    lse: np.ndarray
    masks: np.ndarray
    mask_of_layer: np.ndarray
    overview: np.ndarray
    stats: dict[str, np.ndarray]
    pool: int
    model_kind: str
    description: str
    causal: bool
    score_scale: float
    score_softcap: float | None = None
    next_token_ids: np.ndarray | None = None
    next_token_probs: np.ndarray | None = None
    meta_extra: dict = field(default_factory=dict)
    reply_start: int | None = None
    dtype: str = "float32"

    def __post_init__(self) -> None:
        n_layers, n_heads, n, _ = self.queries.shape
        if len(self.tokens) != n or self.lse.shape != (n_layers, n_heads, n) or self.keys.shape[2] != n:
            raise CompactFormatError("The compact trace's arrays disagree on the number of tokens or heads.")
        if self.reply_start is not None and not 0 < int(self.reply_start) < n:
            raise CompactFormatError(f"The reply starts at {self.reply_start}, outside the trace's 1-{n - 1}.")
        if self.masks.shape[1:] != (n, n) or self.mask_of_layer.shape != (n_layers,):
            raise CompactFormatError("The compact trace's masks do not match its tokens or layers.")

    sentence_b_start = None  # a long input is one text

    def weights(self, layer: int, head: int, rows: slice = slice(None), cols: slice = slice(None)) -> np.ndarray:
        """The exact attention weights of one head over a window: ``exp(score - lse)``, 0 where masked.

        Raises:
            ValueError: the layer, head or window is out of range (the message names the valid range).

        Shape: -> (rows, cols) float32.
        """
        self._check(layer, head)
        r0, r1 = _window(rows, self.n_tokens, "rows")
        c0, c1 = _window(cols, self.n_tokens, "cols")
        q = torch.from_numpy(np.ascontiguousarray(self.queries[layer, head, r0:r1]))
        k = torch.from_numpy(np.ascontiguousarray(self.keys[layer, int(self.kv_heads[head]), c0:c1]))
        allowed = torch.from_numpy(np.ascontiguousarray(self.masks[self.mask_of_layer[layer], r0:r1, c0:c1]))
        scores = attention_scores(q, k, scale=self.score_scale, softcap=self.score_softcap)
        masked = apply_mask(scores, allowed, inplace=True).double()
        return weights_from_scores(masked, self.lse[layer, head, r0:r1], inplace=True).float().numpy()

    def layer_mask(self, layer: int):
        """The layer's mask as a ``LayerMask``, its checks (causal? a key ahead?) made once per distinct mask and
        kept: each is a pass over n x n booleans, 30 ms at 4,096 tokens."""
        index = int(self.mask_of_layer[layer])
        cache = self.__dict__.setdefault("_layer_masks", {})  # frozen: the dict is set once, then filled
        if index not in cache:
            cache[index] = LayerMask.of(torch.from_numpy(self.masks[index]))
        return cache[index]

    def pair_weights(self, layer: int, q_pos: np.ndarray, k_pos: np.ndarray) -> np.ndarray:
        """The exact weights of every head at scattered (query, key) pairs: O(pairs · d_head), no window.

        Shape: q_pos, k_pos (pairs,) int -> (head, pairs) float64, 0 where masked.
        """
        self._check(layer, 0)
        qi, ki = torch.as_tensor(q_pos, dtype=torch.long), torch.as_tensor(k_pos, dtype=torch.long)
        q = torch.from_numpy(self.queries[layer])[:, qi]  # (head, pairs, d_head)
        k = expand_kv(self.keys[layer], self.kv_heads)[:, ki]
        scores = pair_scores(q, k, scale=self.score_scale, softcap=self.score_softcap)  # (head, pairs) float64
        allowed = torch.from_numpy(self.masks[self.mask_of_layer[layer]])[qi, ki]
        return pair_weights(scores, torch.from_numpy(self.lse[layer])[:, qi], allowed).numpy()

    def _check(self, layer: int, head: int) -> None:
        if not 0 <= layer < self.n_layers:
            raise ValueError(f"Layer {layer} does not exist: this trace has layers 0-{self.n_layers - 1}.")
        if not 0 <= head < self.n_heads:
            raise ValueError(f"Head {head} does not exist: this trace has heads 0-{self.n_heads - 1}.")

    def nbytes(self) -> int:
        """Bytes held by the arrays (the n x n masks as bits would be an eighth)."""
        return sum(a.nbytes for a in (self.queries, self.keys, self.lse, self.masks, self.overview))

    def save(self, path: str | Path) -> Path:
        """Write the trace as an uncompressed NPZ (``FIELDS``)."""
        path = Path(path)
        meta = dict(format=FORMAT, version=VERSION, model_kind=self.model_kind, description=self.description,
                    causal=self.causal, score_scale=self.score_scale, score_softcap=self.score_softcap,
                    pool=self.pool, stat_names=list(self.stats), reply_start=self.reply_start,
                    **{**self.meta_extra, "dtype": self.dtype})
        arrays = dict(meta=np.array(json.dumps(meta)), tokens=np.array(self.tokens, dtype=str),
                      token_ids=self.token_ids, queries=self.queries, keys=self.keys, kv_heads=self.kv_heads,
                      lse=self.lse, masks=np.packbits(self.masks, axis=-1), mask_of_layer=self.mask_of_layer,
                      overview=self.overview, **{f"stat_{k}": v for k, v in self.stats.items()})
        if self.next_token_ids is not None:
            arrays |= {"next_token_ids": self.next_token_ids, "next_token_probs": self.next_token_probs}
        with path.open("wb") as f:
            np.savez(f, **arrays)
        return path


def _window(part: slice, n: int, name: str) -> tuple[int, int]:
    if part.step not in (None, 1):
        raise ValueError(f"{name}: a window is a contiguous range A:B; steps are not supported.")
    start = 0 if part.start is None else int(part.start)
    stop = n if part.stop is None else int(part.stop)
    if not 0 <= start < stop <= n:
        raise ValueError(f"{name} {start}:{stop} is out of range: pick A:B with 0 <= A < B <= {n}.")
    return start, stop


def parse_window(text: str | None, n: int, name: str) -> slice:
    """``"A:B"`` (either end may be left out) as a slice checked against ``n`` positions.

    Raises:
        ValueError: not of the form A:B, or out of range.
    """
    if not text:
        return slice(None)
    parts = text.split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        start, stop = (int(p) if p.strip() else None for p in parts)
    except ValueError:
        raise ValueError(f"{name} must be A:B (positions, end excluded), got {text!r}.") from None
    part = slice(start, stop)
    _window(part, n, name)
    return part


def load_compact(path: str | Path) -> CompactTrace:
    """Read a file written by ``CompactTrace.save``.

    Raises:
        CompactFormatError: the file is missing, not ours, of another version, or truncated.
    """
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            if "meta" not in data.files:
                raise CompactFormatError(f"{path} is not a compact trace of Attention Explorer (no meta record).")
            meta = json.loads(str(data["meta"]))
            if meta.get("format") != FORMAT:
                raise CompactFormatError(f"{path} is not a compact trace (format {meta.get('format')!r}).")
            if meta.get("version") != VERSION:
                raise CompactFormatError(f"{path} is compact format version {meta.get('version')}; this reads "
                                         f"version {VERSION}.")
            arrays = {name: data[name] for name in data.files}
    except FileNotFoundError:
        raise CompactFormatError(f"{path} does not exist.") from None
    except (zipfile.BadZipFile, EOFError, OSError, KeyError, ValueError) as exc:
        if isinstance(exc, CompactFormatError):
            raise
        raise CompactFormatError(f"{path} is not a readable compact trace: it is truncated, or not an NPZ file "
                                 "written by `export --compact`; export it again.") from None
    n = len(arrays["tokens"])
    masks = np.unpackbits(arrays["masks"], axis=-1, count=n).astype(bool)
    return CompactTrace(
        tokens=tuple(str(t) for t in arrays["tokens"]), token_ids=arrays["token_ids"], queries=arrays["queries"],
        keys=arrays["keys"], kv_heads=arrays["kv_heads"], lse=arrays["lse"], masks=masks,
        mask_of_layer=arrays["mask_of_layer"], overview=arrays["overview"],
        stats={k: arrays[f"stat_{k}"] for k in meta["stat_names"]}, pool=int(meta["pool"]),
        model_kind=meta["model_kind"], description=meta["description"], causal=bool(meta["causal"]),
        score_scale=float(meta["score_scale"]), score_softcap=meta["score_softcap"],
        next_token_ids=arrays.get("next_token_ids"), next_token_probs=arrays.get("next_token_probs"),
        reply_start=meta.get("reply_start"),  # files written before generation have none
        dtype=str(meta.get("dtype", "float32")),  # nor files written before the precision setting
    )


Progress = Callable[[str, float], None]
"""Called with a phase ("forward", "summary") and the fraction of it done."""
