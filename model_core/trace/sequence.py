"""A generated sequence as the app's trace reads it: the request's own token ids (``TraceRequest.token_ids``), kept
only while they are still the ids of the request's text, and where the reply starts among them.

A generated reply cannot always be typed back in: re-tokenising its decoded text may split it otherwise (the model
wrote two newline pieces where the tokenizer makes one) and the text's cleaning strips a trailing newline. So a
generated request carries its ids beside its text, and every builder reads the ids while ``decode(ids)`` is still
exactly the text: an edited text, another tokenizer or a sentence B is tokenised as typed, and has no reply.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from model_core.families.encoding import EncodedInput, InputError


def ids_describe_text(tokenizer: Any, request: Any) -> bool:
    """Whether ``request.token_ids`` are still the ids of its one text: decoded with special tokens kept, they give
    ``text_a`` exactly, and there is no sentence B."""
    ids = getattr(request, "token_ids", None)
    if ids is None or request.text_b:
        return False
    try:
        return tokenizer.decode(list(ids), skip_special_tokens=False) == request.text_a
    except (IndexError, OverflowError, TypeError, ValueError):  # an id outside this tokenizer's vocabulary
        return False


def encode_ids(tokenizer: Any, request: Any, *, max_tokens: int, limit_hint: str = "") -> EncodedInput | None:
    """The request's token ids as the model reads them (one text, token types 0), or None when they no longer
    describe its text (``ids_describe_text``): the text is then tokenised as typed.

    Raises:
        InputError: more than ``max_tokens`` ids without ``request.truncate``.
    """
    if not ids_describe_text(tokenizer, request):
        return None
    ids = list(request.token_ids)
    n = len(ids)
    if n > max_tokens:
        if not request.truncate:
            raise InputError(f"The generated text has {n} tokens; the limit is {max_tokens}{limit_hint}. Generate "
                             "fewer tokens, or ask for truncation to keep the first tokens.")
        ids = ids[:max_tokens]
    return EncodedInput(tokens=tuple(tokenizer.convert_ids_to_tokens(ids)),
                        input_ids=torch.tensor([ids], dtype=torch.long),
                        token_type_ids=torch.zeros(1, len(ids), dtype=torch.long), sentence_b_start=None,
                        truncated=len(ids) < n)


def reply_position(request: Any, encoded: EncodedInput) -> int | None:
    """Where the reply starts in ``encoded``: the request's ``reply_start`` when ``encoded`` holds its generated ids
    and the reply is within them; else None (a typed-in or edited text has no reply)."""
    start = getattr(request, "reply_start", None)
    ids = getattr(request, "token_ids", None)
    if start is None or ids is None:
        return None
    got = encoded.input_ids[0].tolist()
    if got != list(ids[:len(got)]) or not 0 < start < len(got):
        return None
    return int(start)


def with_reply(trace: Any, request: Any, encoded: EncodedInput) -> Any:
    """``trace`` (full or compact) with ``reply_start`` set from the request (``reply_position``); unchanged when the
    request has no reply."""
    start = reply_position(request, encoded)
    return trace if start is None else dataclasses.replace(trace, reply_start=start)


def check_reply(tokenizer: Any, request: Any) -> None:
    """Raise when a request's generated ids do not describe its text (a caller that built one itself).

    Raises:
        InputError: the ids decode to another text; the message says how to build the request.
    """
    if getattr(request, "token_ids", None) is not None and not ids_describe_text(tokenizer, request):
        raise InputError("The request's token_ids do not decode to its text_a: set text_a to "
                         "tokenizer.decode(token_ids, skip_special_tokens=False) and leave text_b empty.")


__all__ = ["check_reply", "encode_ids", "ids_describe_text", "reply_position", "with_reply"]
