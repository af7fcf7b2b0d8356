"""What a full trace (``model_core.trace.trace``) and a compact one (``model_core.compact.trace``) say alike about their shape
and family, from their ``tokens``, ``queries``, ``kv_heads`` and ``model_kind``."""

from __future__ import annotations

from functools import cached_property

import numpy as np

from model_core.families import family_named
from model_core.words import is_byte_level, readable_tokens


class TraceShape:
    """Sizes and family shared by both trace kinds (a mixin: the dataclasses hold the fields)."""

    @property
    def n_layers(self) -> int:
        return int(self.queries.shape[0])  # (layer, head, pos, d_head) in both kinds

    @property
    def n_heads(self) -> int:
        return int(self.queries.shape[1])

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def d_head(self) -> int:
        return int(self.queries.shape[-1])

    @property
    def n_kv_heads(self) -> int:
        return int(self.kv_heads.max()) + 1

    @property
    def family(self):
        """This trace's family adapter (``model_core.families``)."""
        return family_named(self.model_kind)

    @cached_property
    def byte_level(self) -> bool:
        """Whether the tokens are byte-level BPE pieces (``model_core.words.is_byte_level``), judged on the text's
        own pieces: a special token may hold any characters (DeepSeek's ``<｜begin▁of▁sentence｜>``)."""
        specials = getattr(self, "special_tokens", frozenset())
        return self.family.word_rule == "bpe" and is_byte_level([t for t in self.tokens if t not in specials])

    @cached_property  # pickers call it once per option
    def labels(self) -> tuple[str, ...]:
        """The tokens as the views label them: byte-level pieces decoded, BPE space marks shown as "␣"
        (``model_core.words.readable_tokens``); WordPieces as they are."""
        return readable_tokens(self.tokens, self.family.word_rule, self.byte_level)

    @property
    def is_decoder(self) -> bool:
        """Whether a causal language model produced this trace."""
        return self.family.is_decoder


class LayerHeadGrid:
    """``n_layers`` and ``n_heads`` of a result whose ``grid_shape`` starts (layers, heads) (a mixin)."""

    @property
    def n_layers(self) -> int:
        return int(self.grid_shape[0])

    @property
    def n_heads(self) -> int:
        return int(self.grid_shape[1])


def freeze_arrays(result: object) -> None:
    """Mark every numpy array a result holds read-only: results are cached and shared by every page and session."""
    for value in vars(result).values():
        if isinstance(value, np.ndarray):
            value.setflags(write=False)


def arrays_nbytes(result: object) -> int:
    """Bytes held by the numpy arrays of a result (what a cache bounded by bytes counts)."""
    return sum(value.nbytes for value in vars(result).values() if isinstance(value, np.ndarray))
