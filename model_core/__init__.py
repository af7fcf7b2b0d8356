"""model_core: the from-scratch encoder, pretrained models of every family, and one AttentionTrace for all.

The public names load on first use (PEP 562), so ``import model_core`` and the command line's ``--help`` or a usage
error do not import torch and transformers (7 s on a small machine) before they are needed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from model_core.lazy import lazy_exports

_HOMES = {
    "EncoderConfig": "model_core.chapter3.config",
    "CustomSpec": "model_core.chapter3.spec",
    "build_custom_model": "model_core.models.custom",
    **dict.fromkeys(("DEFAULT_TEXT_A", "DEFAULT_TEXT_B", "InputError", "encode"), "model_core.families.encoding"),
    **dict.fromkeys(("FAMILIES", "family_named"), "model_core.families"),
    **dict.fromkeys(("trace_custom", "trace_model", "trace_pretrained"), "model_core.trace.forward"),
    **dict.fromkeys(("ModelLoadError", "load_pretrained", "select_device"), "model_core.models.loading"),
    **dict.fromkeys(("Models", "TraceRequest", "build_trace"), "model_core.trace.request"),
    "build_walkthrough": "model_core.walk.build",
    "AttentionTrace": "model_core.trace.trace",
}
"""Each public name and the module it lives in."""

__all__ = sorted(_HOMES)

if TYPE_CHECKING:  # what type checkers and editors see: the same names, imported eagerly
    from model_core.chapter3.config import EncoderConfig
    from model_core.chapter3.spec import CustomSpec
    from model_core.families import FAMILIES, family_named
    from model_core.families.encoding import DEFAULT_TEXT_A, DEFAULT_TEXT_B, InputError, encode
    from model_core.models.custom import build_custom_model
    from model_core.models.loading import ModelLoadError, load_pretrained, select_device
    from model_core.trace.forward import trace_custom, trace_model, trace_pretrained
    from model_core.trace.request import Models, TraceRequest, build_trace
    from model_core.trace.trace import AttentionTrace
    from model_core.walk.build import build_walkthrough


__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
