"""The compact trace of a generated sequence too long for a full one: built by the one compact builder, checked to
read the generated ids themselves, with the reply's start set."""

from __future__ import annotations

import dataclasses
from typing import Any

from model_core.compact.build import build_compact


def compact_of(request: Any, resolved: Any, progress: Any = None) -> Any:
    """The compact trace (``model_core.compact.build.build_compact``) of a generated request
    (``Generation.request``), ``reply_start`` set.

    Raises:
        ValueError: the compact builder read other tokens than the generated ids (its text re-tokenised otherwise);
            the message says what to do.
    """
    trace = build_compact(request, device=resolved.device, settings=resolved.settings, models=resolved.models,
                          max_tokens=resolved.limit()["max_tokens"], progress=progress)
    ids = trace.token_ids.tolist()
    if ids != list(request.token_ids):
        first = next((i for i, (a, b) in enumerate(zip(ids, request.token_ids)) if a != b), min(len(ids),
                                                                                             len(request.token_ids)))
        raise ValueError(f"The compact trace re-tokenised the generated text and differs from the generated tokens "
                         f"at position {first}; write a full trace instead (raise AE_FULL_TRACE_MB) or generate fewer "
                         "tokens.")
    return trace if trace.reply_start == request.reply_start else dataclasses.replace(
        trace, reply_start=request.reply_start)
