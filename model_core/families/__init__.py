"""One adapter per model family, chosen from the config's ``model_type``: everything a family does its own way
(reading text, special tokens, where each head's queries/keys/values are, the output projection, switching heads
off, joining pieces into words) lives in its module here, and nowhere else.

| family   | module      | model types |
|----------|-------------|-------------|
| custom   | custom.py   | the chapter-3 encoder of ``model_core.chapter3.model`` |
| bert     | bert.py     | bert |
| gpt2     | gpt2.py     | gpt2 |
| llama    | llama.py    | llama, qwen2, qwen3, mistral, gemma, gemma2, gemma3_text, phi3, phi, ... |
"""

from __future__ import annotations

from typing import Any

from model_core.chapter3.model import TransformerForSequenceClassification
from model_core.families.base import Family, ForwardOutput
from model_core.families.bert import BertFamily
from model_core.families.custom import CustomFamily
from model_core.families.gpt2 import GPT2Family
from model_core.families.llama import LlamaFamily

FAMILIES: dict[str, Family] = {f.name: f for f in (CustomFamily(), BertFamily(), GPT2Family(), LlamaFamily())}
"""Family name -> its adapter."""

DECODER_FAMILIES = tuple(name for name, f in FAMILIES.items() if f.is_decoder)
_BY_MODEL_TYPE = {t: f for f in FAMILIES.values() for t in f.model_types}
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(_BY_MODEL_TYPE)


def family_named(name: str) -> Family:
    """The adapter of a family by its name (``AttentionTrace.model_kind``)."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"Unknown model family {name!r}; use one of {', '.join(FAMILIES)}.") from None


def family_of_type(model_type: str | None) -> Family | None:
    """The adapter serving a transformers ``model_type``, or None when no family does."""
    return _BY_MODEL_TYPE.get(model_type or "")


def family_of_config(config: Any, model_id: str) -> Family:
    """The adapter serving a transformers config (read before the model is loaded).

    Raises:
        ValueError: no family serves its model type; the message names it.
    """
    family = family_of_type(getattr(config, "model_type", None))
    if family is None:
        raise ValueError(f"{model_id!r} is a {getattr(config, 'model_type', None)!r} model, which no family serves.")
    return family


def family_of(model: Any) -> Family:
    """The adapter of a loaded model (transformers or the chapter-3 encoder)."""
    if isinstance(model, TransformerForSequenceClassification):
        return FAMILIES["custom"]
    family = family_of_type(getattr(model.config, "model_type", None))
    if family is None:
        raise ValueError(f"No family serves model type {model.config.model_type!r}.")
    return family


__all__ = [
    "DECODER_FAMILIES",
    "FAMILIES",
    "SUPPORTED_MODEL_TYPES",
    "Family",
    "ForwardOutput",
    "family_named",
    "family_of",
    "family_of_config",
    "family_of_type",
]
