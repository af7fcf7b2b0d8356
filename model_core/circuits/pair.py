"""One prompt pair of a dataset, and a problem with one row: the types every part of ``circuits`` shares."""

from __future__ import annotations

from dataclasses import dataclass

FIELDS = ("clean", "corrupt", "answer", "foil")
"""A pair's four fields, in the order a CSV's columns name them."""


@dataclass(frozen=True)
class Pair:
    """A clean prompt, a corrupted one of the same token count, and the two tokens the metric compares.

    M = logit(answer) − logit(foil) at the last position: the clean prompt should give the answer, the corrupted one
    the foil.

    Attributes:
        clean, corrupt: the two prompts, tokenised as ``tokenizer(text).input_ids``.
        answer, foil: one token each, as written (leading space kept: " Mary").

    Raises:
        ValueError: a field that is not a string, or is empty.
    """

    clean: str
    corrupt: str
    answer: str
    foil: str

    def __post_init__(self) -> None:
        for name in FIELDS:
            value = getattr(self, name)
            if not isinstance(value, str):
                raise ValueError(f"the {name} must be text, not {type(value).__name__} ({value!r})")
            if not value:
                raise ValueError(f"the {name} is empty")

    def to_dict(self) -> dict[str, str]:
        """{"clean", "corrupt", "answer", "foil"}: one JSONL line's object."""
        return {name: getattr(self, name) for name in FIELDS}


@dataclass(frozen=True)
class Problem:
    """Why one pair of a dataset was not run.

    Attributes:
        row: the pair's 1-based row in its dataset (a file's records, header and blank lines not counted).
        message: what is wrong, with the pair's pieces where the tokenizer is the cause.
        line: the line of the file it came from, when that is another number than ``row``.
    """

    row: int
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = f"row {self.row}" if self.line in (None, self.row) else f"row {self.row}, line {self.line}"
        return f"pair {self.row} ({where}): {self.message}"
