"""The inputs of activation patching, checked: two prompts of one length, an answer and a foil of one token each, on
a decoder. Every message says what to change."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

import numpy as np

from model_core.families import Family, checks
from model_core.families.checks import token_id_of
from model_core.trace.request import TraceRequest

CONTRIBUTIONS_HINT = ("The Contributions page (python -m model_core graph) works for encoders: it follows what each "
                      "head and block adds to any token.")


class PatchingError(ValueError):
    """Inputs activation patching cannot use; the message says why and what to change."""


@dataclass(frozen=True, eq=False)
class PatchInputs:
    """Two prompts as the model reads them, and the two tokens the metric compares.

    Attributes:
        clean_ids, corrupt_ids: the token ids. Shape: (pos,) int64 each.
        clean_tokens, corrupt_tokens: each token as text (" John", not "ĠJohn").
        answer, foil: as the user wrote them; answer_id, foil_id: their one token each.
        differing: the positions where the two prompts' tokens differ. Shape: (k,) int64.
    """

    clean_ids: np.ndarray
    corrupt_ids: np.ndarray
    clean_tokens: tuple[str, ...]
    corrupt_tokens: tuple[str, ...]
    answer: str
    foil: str
    answer_id: int
    foil_id: int
    differing: np.ndarray

    def __post_init__(self) -> None:
        if self.clean_ids.shape != self.corrupt_ids.shape or self.clean_ids.ndim != 1:
            raise ValueError(f"clean_ids {self.clean_ids.shape} and corrupt_ids {self.corrupt_ids.shape} must be one "
                             "length.")

    @property
    def n_tokens(self) -> int:
        return int(self.clean_ids.shape[0])


def require_decoder(family: Family) -> None:
    """Refuse an encoder: patching reads next-token logits.

    Raises:
        NotADecoder: the family is not a decoder language model (``families.checks.require_decoder``).
    """
    checks.require_decoder(family, "activation patching (it compares next-token logits)", instead=CONTRIBUTIONS_HINT)


def token_texts(tokenizer: Any, ids: np.ndarray | list[int]) -> tuple[str, ...]:
    """Each id as text, the way the pages show tokens (" John", "\\n")."""
    return tuple(tokenizer.decode([int(i)]) for i in ids)


def describe_difference(clean: tuple[str, ...], corrupt: tuple[str, ...]) -> str:
    """Which tokens differ between two token lists, in a few words: "clean 6-7 ' Eiffel' ' Tower' → corrupted 6
    ' Colosseum'"."""
    matcher = difflib.SequenceMatcher(a=clean, b=corrupt, autojunk=False)
    parts = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        left = " ".join(repr(t) for t in clean[i1:i2]) or "nothing"
        right = " ".join(repr(t) for t in corrupt[j1:j2]) or "nothing"
        parts.append(f"clean {_span(i1, i2)} {left} → corrupted {_span(j1, j2)} {right}")
    return "; ".join(parts[:4]) + ("; …" if len(parts) > 4 else "")


def _span(start: int, stop: int) -> str:
    if stop <= start:
        return f"at {start}"
    return f"{start}" if stop == start + 1 else f"{start}-{stop - 1}"


def check_inputs(tokenizer: Any, family: Family, clean_ids: np.ndarray, corrupt_ids: np.ndarray, answer: str,
                 foil: str) -> PatchInputs:
    """Check two tokenised prompts and the answer and foil, and return them ready for patching.

    Args:
        clean_ids, corrupt_ids: the prompts as the model reads them (``Family.encode``). Shape: (pos,) each.
        answer, foil: one token each, as written.

    Raises:
        PatchingError: prompts of different lengths (both counts and which tokens differ), the same prompt twice,
            or the answer equal to the foil. NotADecoder: an encoder. NotOneToken: an answer or foil that is not one
            token (its pieces). All three are ValueErrors.
    """
    require_decoder(family)
    clean_ids = np.asarray(clean_ids, dtype=np.int64).ravel()
    corrupt_ids = np.asarray(corrupt_ids, dtype=np.int64).ravel()
    clean_tokens, corrupt_tokens = token_texts(tokenizer, clean_ids), token_texts(tokenizer, corrupt_ids)
    if len(clean_ids) != len(corrupt_ids):
        raise PatchingError(f"The clean prompt is {len(clean_ids)} tokens and the corrupted prompt "
                            f"{len(corrupt_ids)}; patching swaps activations position by position, so they must be "
                            f"the same length. They differ here: {describe_difference(clean_tokens, corrupt_tokens)}. "
                            "Change words for words of as many tokens.")
    differing = np.flatnonzero(clean_ids != corrupt_ids)
    if differing.size == 0:
        raise PatchingError("The clean and corrupted prompts are the same tokens, so their metrics are equal and no "
                            "effect can be normalised. Change a word of the corrupted prompt (e.g. swap a name).")
    answer_id, foil_id = token_id_of(tokenizer, answer, "answer"), token_id_of(tokenizer, foil, "foil")
    if answer_id == foil_id:
        raise PatchingError(f"The answer and the foil are the same token ({answer!r}), so the metric logit(answer) − "
                            "logit(foil) is always 0. Choose a foil the corrupted prompt would give instead.")
    return PatchInputs(clean_ids, corrupt_ids, clean_tokens, corrupt_tokens, answer, foil, answer_id, foil_id,
                       differing.astype(np.int64))


def prepare_inputs(resolved: Any, clean: str, corrupt: str, answer: str, foil: str) -> PatchInputs:
    """Tokenise two prompts as the model's trace would (``Resolved.encode``: its family's rule, its BOS) and check
    them with the answer and foil (``check_inputs``).

    Args:
        resolved: a ``model_core.trace.resolve.Resolved`` pretrained model.

    Raises:
        PatchingError: as ``check_inputs``; InputError: a prompt is empty or too long.
    """
    require_decoder(resolved.family)
    encoded = [resolved.encode(TraceRequest("pretrained", text, "")) for text in (clean, corrupt)]
    return check_inputs(resolved.tokenizer, resolved.family, encoded[0].input_ids[0].numpy(),
                        encoded[1].input_ids[0].numpy(), answer, foil)
