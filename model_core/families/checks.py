"""The two checks every next-token analysis makes before it runs, written once: the model is a decoder
(``require_decoder``), and an answer or foil is one token as written (``token_id_of``). Each raises a ValueError
subclass whose message says what to change."""

from __future__ import annotations

from typing import Any

DECODER_HINT = "a decoder language model such as the bundled SmolLM2-135M-Instruct, GPT-2 or a Llama-like model"
"""What to pick instead of an encoder, in every message of ``require_decoder``."""


class NotADecoder(ValueError):
    """A next-token analysis (attribution, patching, generation, the logit lens, the KV cache) was asked of an
    encoder, which predicts no next token."""


class NotOneToken(ValueError):
    """An answer or foil that the tokenizer splits into several pieces (or none).

    Attributes:
        text: the text as given; role: what it was ("answer", "foil", "token"); pieces: its tokens as text.
    """

    def __init__(self, text: str, pieces: tuple[str, ...], role: str = "token") -> None:
        self.text, self.pieces, self.role = text, pieces, role
        if not text:
            message = f"The {role} is empty; type one token, with its leading space (e.g. \" Paris\")."
        else:
            shown = " + ".join(repr(p) for p in pieces) or "nothing"
            hint = "" if text.startswith(" ") else " A word in running text usually starts with a space (\" Paris\")."
            message = (f"The {role} {text!r} is {len(pieces)} tokens for this model: {shown}. Give a single token: "
                       f"one of these pieces, or a word the vocabulary holds whole.{hint}")
        super().__init__(message)


def token_id_of(tokenizer: Any, text: str, role: str = "token") -> int:
    """The id of the one token ``text`` is, as written (a leading space included: " Paris").

    Args:
        role: what the text is, for the message ("answer", "foil").

    Raises:
        NotOneToken: ``text`` is empty or several tokens; its ``pieces`` list them.
    """
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []
    if len(ids) != 1:
        raise NotOneToken(text, tuple(tokenizer.decode([int(i)]) for i in ids), role)
    return int(ids[0])


def require_decoder(family: Any, needs: str, *, instead: str = "") -> None:
    """Refuse an encoder for a next-token analysis.

    Args:
        family: the model's adapter (or anything with ``is_decoder`` and ``label``, such as ``trace.family``).
        needs: what needs the decoder, for the message ("activation patching", "the logit lens").
        instead: a sentence on what works for an encoder, appended to the message.

    Raises:
        NotADecoder: the family is an encoder's; the message says what to pick.
    """
    if not family.is_decoder:
        raise NotADecoder(f"A {family.label} predicts no next token (it reads the whole text at once), so {needs} "
                          f"needs {DECODER_HINT}." + (f" {instead}" if instead else ""))
