"""TransformerLens's verbs on any family the app reads: ``run_with_cache(text, names=...)`` returns activations by
hook-point name, ``run_with_hooks(text, hooks=[(name, fn)])`` runs the model with hook functions that read or write
them (``model_core.families.hooks`` lists the points and their shapes)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from model_core.families.hooked import model_points
from model_core.families.hooked import run_with_hooks as _run
from model_core.families.hooks import HookFn, add, patch
from model_core.qk.terms import encode_exactly
from model_core.trace.request import TraceRequest
from model_core.trace.resolve import resolve

LONG_FROM = 1024
"""From this many tokens a decoder runs its compact pass (sdpa, no n x n pattern): every point but ``hook_pattern``
and the split inputs is served."""

N2_POINTS = ("hook_pattern", "hook_q_input", "hook_k_input", "hook_v_input")
"""The points a long prompt's compact pass does not serve: the n x n pattern, and split inputs (which need it)."""


@dataclass(frozen=True, eq=False)
class ActivationCache(Mapping):
    """Activations by hook-point name (a read-only mapping, as TransformerLens's ``ActivationCache``).

    Attributes:
        tokens: the pieces, ``tokenizer(text).input_ids`` as the tokenizer names them.
        logits: a decoder's next-token logits (1, pos, vocab), the chapter-3 encoder's class logits, else None.
        compact: the pass was a long prompt's compact one (no ``hook_pattern``, no split inputs).
    """

    cache: dict[str, torch.Tensor]
    tokens: list[str]
    logits: torch.Tensor | None
    compact: bool = False

    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            return self.cache[name]
        except KeyError:
            raise KeyError(f"{name!r} was not cached: pass it in names= (cached: {', '.join(list(self.cache)[:6])}"
                           f"{' ...' if len(self.cache) > 6 else ''}).") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.cache)

    def __len__(self) -> int:
        return len(self.cache)


def _model(model: str | None, device: str | None):
    return resolve(TraceRequest("pretrained", "", model_id=model), device=device)


def hook_points(model: str | None = None, *, device: str | None = None) -> list[str]:
    """Every hook point of ``model`` (a hub id, folder or bundled id; default: the bundled BERT)."""
    return model_points(_model(model, device).model)


def run_with_cache(text: str, names: Iterable[str] | Callable[[str], bool] | None = None, *,
                   model: str | None = None, device: str | None = None) -> ActivationCache:
    """Run ``model`` once on ``text`` (``tokenizer(text).input_ids``, no chat template) and return the activations
    of ``names`` (point names, a filter on names, or None: every point) by name.

    For a long prompt (a decoder from ``LONG_FROM`` tokens) the pass is compact: every point but the n x n pattern
    and the split inputs is served; asking for those raises a ``ValueError`` that says so.

    Raises:
        ValueError: an unknown point, an empty text, a point the pass cannot reach.
    """
    resolved = _model(model, device)
    ids = encode_exactly(resolved.tokenizer, text)
    every = model_points(resolved.model)
    if names is None:
        chosen = every
    elif callable(names):
        chosen = [n for n in every if names(n)]
    else:
        chosen = list(names)
    compact = _compact(resolved, ids)
    if compact:
        wanted = [n for n in chosen if n.endswith(N2_POINTS)]
        if names is None or callable(names):
            chosen = [n for n in chosen if not n.endswith(N2_POINTS)]
        elif wanted:
            raise ValueError(f"At {ids.shape[1]} tokens the pass is compact and never forms the n x n pattern: "
                             f"{', '.join(wanted[:3])} need it. Every other point is served (q, k, v, z, result, the "
                             "residual stream, the MLPs, the norms' scales); for the pattern, use a shorter text.")
    out = _run(resolved.model, ids, names=chosen, compact=compact)
    return ActivationCache(out.cache, resolved.tokenizer.convert_ids_to_tokens(ids[0].tolist()), out.logits,
                           compact)


def run_with_hooks(text: str, hooks: Iterable[tuple[str, HookFn]], *, names: Iterable[str] = (),
                   model: str | None = None, device: str | None = None) -> ActivationCache:
    """Run ``model`` on ``text`` with hook functions: each gets (tensor, hook) and may return a replacement of the
    same shape (``patch(value, positions)`` and ``add(delta, positions)`` build the usual ones). ``names``: points to
    cache as well. Returns the logits (``.logits``) and those points."""
    resolved = _model(model, device)
    ids = encode_exactly(resolved.tokenizer, text)
    out = _run(resolved.model, ids, names=list(names), hooks=list(hooks), compact=_compact(resolved, ids))
    return ActivationCache(out.cache, resolved.tokenizer.convert_ids_to_tokens(ids[0].tolist()), out.logits,
                           _compact(resolved, ids))


def _compact(resolved: Any, ids: torch.Tensor) -> bool:
    return bool(resolved.family.is_decoder and ids.shape[1] >= LONG_FROM)


__all__ = ["ActivationCache", "add", "hook_points", "patch", "run_with_cache", "run_with_hooks"]
