"""Resolve a request's model once: the device, the settings, the loaded model (or the custom encoder), its family
and tokenizer, and its input limit; and tokenise a text for it once (``Resolved.encode``).

Every builder (a full trace, a compact one, the form decision, both walks, head masking's run, a corpus model) starts
here, so "which model does this request run, on which device, taking how many tokens" has one answer.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch

from model_core.chapter3.spec import CustomSpec, describe_custom
from model_core.families import Family, family_of
from model_core.models.custom import build_custom_model
from model_core.models.loading import LoadedModel, load_pretrained, load_tokenizer, select_device
from model_core.settings import BUNDLED_MODEL_ID, Settings, load_settings, resolve_model_id
from model_core.families.encoding import EncodedInput
from model_core.trace.sequence import encode_ids

ENCODED_KEPT = 16
"""How many recent encodings ``Resolved.encode`` keeps: the form decision's tokens serve the build that follows."""


class ModelChoice(Protocol):
    """What names a model: a ``TraceRequest`` or a ``CorpusModel``."""

    model: str  # "pretrained" or "custom"
    model_id: str | None

    def spec(self, default_model: str | None = None) -> CustomSpec: ...


def _kept_pretrained(model_id: str, device: torch.device) -> LoadedModel:
    return load_pretrained(model_id, device=device)


@dataclass(frozen=True)
class Models:
    """Where the builders get their models.

    The default keeps the last few pretrained models for the process (``load_pretrained``) and builds a custom
    encoder afresh. The app passes its ``st.cache_resource`` loaders instead, so one cache holds its models.
    """

    pretrained: Callable[[str, torch.device], LoadedModel] = _kept_pretrained
    custom: Callable[[CustomSpec, torch.device], Any] = build_custom_model

    def tokenizer(self, model_id: str | None, device: torch.device) -> Any:
        """The tokenizer of ``model_id``; the bundled WordPiece vocabulary for None."""
        if model_id in (None, BUNDLED_MODEL_ID, "bundled"):
            return load_tokenizer()
        return self.pretrained(model_id, device).tokenizer


def _default_models(settings: Settings) -> Models:
    """``Models()``, loading at the precision and size limit of ``settings`` where they are not the environment's
    (a notebook's ``dtype=``)."""
    env = load_settings()
    if (settings.dtype, settings.max_params) == (env.dtype, env.max_params):
        return Models()
    chosen = dataclasses.replace(env, dtype=settings.dtype, max_params=settings.max_params)
    return Models(pretrained=lambda model_id, device: load_pretrained(model_id, device=device, settings=chosen))


def model_id_of(choice: ModelChoice, settings: Settings | None = None) -> str | None:
    """The model a request runs, without loading it: a pretrained request's id (the deployment's default for
    none), or the BERT whose weights a custom encoder takes (None for random weights)."""
    settings = settings or load_settings()
    if choice.model == "pretrained":
        return resolve_model_id(choice.model_id, settings)
    return choice.spec(settings.default_model).model_id


def token_limit(settings: Settings, max_positions: int, max_tokens: int | None = None) -> dict[str, Any]:
    """The longest input a model takes here, and what sets it, for ``Family.encode``'s message.

    Args:
        max_tokens: a caller's own limit (a compact trace's ``--max-tokens``); None means ``AE_MAX_TOKENS``.
    """
    limit, name = (settings.max_tokens, "AE_MAX_TOKENS") if max_tokens is None else (
        max_tokens, "max_tokens, --max-tokens on the command line")
    if limit <= max_positions:
        hint = f" ({name}; this model's positions allow {max_positions})" if limit < max_positions else ""
        return {"max_tokens": limit, "limit_hint": hint}
    return {"max_tokens": max_positions, "limit_hint": " (the model's position table)"}


_ENCODED: OrderedDict[tuple, EncodedInput] = OrderedDict()
_ENCODED_LOCK = threading.Lock()


@dataclass(frozen=True, eq=False)
class Resolved:
    """A request's model, ready to run.

    Attributes:
        device: where the model is.
        settings: the deployment's settings the request was resolved under.
        models: where the model came from (``Models``).
        model: the loaded transformers model, or the chapter-3 encoder.
        family: its adapter (``model_core.families``).
        tokenizer: its tokenizer (the bundled WordPiece vocabulary for a random custom encoder).
        max_positions: the longest input its positions allow.
        description: one line naming the model, for the pages.
        key: what names the model's tokenizer (the encodings cache's key).
        loaded: the ``LoadedModel`` of a pretrained model, else None.
        spec: the custom encoder's spec, else None.
    """

    device: torch.device
    settings: Settings
    models: Models
    model: Any
    family: Family
    tokenizer: Any
    max_positions: int
    description: str
    key: tuple
    loaded: LoadedModel | None = None
    spec: CustomSpec | None = None

    def limit(self, max_tokens: int | None = None) -> dict[str, Any]:
        """``token_limit`` for this model."""
        return token_limit(self.settings, self.max_positions, max_tokens)

    def encode(self, request: Any, max_tokens: int | None = None) -> EncodedInput:
        """The request's text (``text_a``, ``text_b``, ``truncate``) as this model reads it, tokenised once: the
        last few encodings are kept, so the form decision and the build that follows share one. A generated
        sequence's request reads its own ``token_ids`` while they still decode to its text.

        Args:
            max_tokens: a caller's own limit; None means ``AE_MAX_TOKENS`` (both within the model's positions).

        Raises:
            InputError: the text cannot be traced; the message says what to change.
        """
        limit = self.limit(max_tokens)
        if getattr(request, "token_ids", None) is not None:  # a generated sequence: its own ids, while they fit its text
            found = encode_ids(self.tokenizer, request, **limit)
            if found is not None:
                return found
        key = (self.key, request.text_a, request.text_b, bool(request.truncate), limit["max_tokens"])
        with _ENCODED_LOCK:
            found = _ENCODED.get(key)
            if found is not None:
                _ENCODED.move_to_end(key)
                return found
        encoded = self.family.encode(self.tokenizer, request.text_a, request.text_b, truncate=request.truncate,
                                     **limit)
        with _ENCODED_LOCK:
            _ENCODED[key] = encoded
            while len(_ENCODED) > ENCODED_KEPT:
                _ENCODED.popitem(last=False)
        return encoded


def resolve(choice: ModelChoice, *, device: str | torch.device | None = None, settings: Settings | None = None,
            models: Models | None = None, walk: bool = False) -> Resolved:
    """Load (or build) the model a request names, once, with what running it needs.

    Args:
        choice: a ``TraceRequest`` (or a ``CorpusModel``): "pretrained" with a model id (None: the deployment's
            default), or "custom" with its spec.
        device: "auto", "cpu", "cuda", "mps" or a torch device; default: the settings' (cuda → mps → cpu).
        settings: the deployment's settings (default: read from the environment).
        models: where the models come from (default: ``Models()``).
        walk: the chapter-3 encoder that walks an encoder request (``TraceRequest.walk_spec``: BERT's weights in
            it for a pretrained BERT) instead of the request's own model.

    Raises:
        ModelLoadError: the pretrained model cannot be loaded.
        ValueError: an option is out of range.
    """
    settings = settings or load_settings()
    dev = device if isinstance(device, torch.device) else select_device(device or settings.device)
    models = models or _default_models(settings)
    if choice.model == "pretrained" and not walk:
        loaded = models.pretrained(model_id_of(choice, settings), dev)
        return Resolved(dev, settings, models, loaded.model, loaded.family, loaded.tokenizer, loaded.max_positions,
                        loaded.description, ("pretrained", loaded.source.model_id), loaded=loaded)
    spec = choice.walk_spec(settings.default_model) if walk else choice.spec(settings.default_model)
    custom = models.custom(spec, dev)
    return Resolved(dev, settings, models, custom, family_of(custom), models.tokenizer(spec.model_id, dev),
                    int(custom.config.max_position_embeddings), describe_custom(spec, custom),
                    ("custom", spec.model_id), spec=spec)
