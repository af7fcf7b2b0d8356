"""The needle-in-a-haystack prompt of the retrieval probe: a haystack the team wrote for it, and the needle.

The haystack is plain prose about nothing in particular (a town, its weather, its trades), so that no sentence
of it answers the question; the needle is one sentence with a password of three words drawn by the seed.
"""

from __future__ import annotations

from importlib import resources

import numpy as np

HAYSTACK: tuple[str, ...] = tuple(
    line for line in (resources.files(__package__) / "haystack.txt").read_text(encoding="utf-8").splitlines() if line)
"""The haystack's sentences, one a line of ``haystack.txt`` (prose the team wrote)."""

PASSWORD_WORDS: tuple[str, ...] = (
    "amber", "falcon", "copper", "lantern", "violet", "harbor", "meadow", "silver", "thunder", "orchid",
    "granite", "willow", "crimson", "glacier", "saffron", "cobalt",
)

QUESTION = "\nQ: What is the lighthouse keeper's password?\nA: The secret password of the lighthouse keeper is"
NEEDLE = "The secret password of the lighthouse keeper is {password}."


def password(seed: int) -> str:
    """Three distinct words of ``PASSWORD_WORDS`` drawn by ``seed``, e.g. "amber falcon copper"."""
    rng = np.random.default_rng(seed)
    return " ".join(PASSWORD_WORDS[i] for i in rng.choice(len(PASSWORD_WORDS), size=3, replace=False))


def haystack_prompt(secret: str, depth: float, n_sentences: int = len(HAYSTACK)) -> tuple[str, str]:
    """The prompt with the needle after ``depth`` (0-1) of the haystack's ``n_sentences`` sentences.

    Returns:
        (prompt, needle sentence); the prompt ends with the start of the answer, so the model's next words are
        the password.
    """
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be between 0 and 1, got {depth}.")
    sentences = list(HAYSTACK[:n_sentences])
    needle = NEEDLE.format(password=secret)
    sentences.insert(round(depth * len(sentences)), needle)
    return " ".join(sentences) + QUESTION, needle
