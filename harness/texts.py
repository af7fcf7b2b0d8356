"""Texts of an exact token count, for the benches and the page-budget tests."""

from __future__ import annotations

WORDS = ("the quick brown fox jumps over the lazy dog while a small bird sings in the old tree near the river "
         "and children play with a red ball on the green grass under the warm sun of a long summer day").split()
DECODERS = {"SmolLM2-135M decoder 30x9"}  # no [CLS]/[SEP]: a text of n words is n tokens


def text_of(n_tokens: int, variant: int, label: str = "") -> str:
    """One sentence (no sentence B) of exactly ``n_tokens`` tokens: WordPieces with [CLS] and [SEP] for the
    encoders, SmolLM2's BPE pieces (every word here is one) for the decoder.

    ``variant`` rotates the words, so every measurement runs a new forward pass.
    """
    if label in DECODERS:  # a word without its leading space may be two pieces ("jumps"): begin with "the"
        return " ".join(["the", *(WORDS[(i + 7 * variant) % len(WORDS)] for i in range(n_tokens - 1))])
    return " ".join(WORDS[(i + 7 * variant) % len(WORDS)] for i in range(n_tokens - 2))
