"""model_core: the from-scratch encoder, pretrained models of every family, and one AttentionTrace for all."""

from model_core.chapter3.config import EncoderConfig
from model_core.chapter3.spec import CustomSpec, build_custom_model
from model_core.trace.encoding import DEFAULT_TEXT_A, DEFAULT_TEXT_B, InputError, encode
from model_core.families import FAMILIES, family_named
from model_core.trace.forward import trace_custom, trace_model, trace_pretrained
from model_core.models.loading import ModelLoadError, load_pretrained, select_device
from model_core.trace.request import Models, TraceRequest, build_trace, build_walkthrough
from model_core.trace.trace import AttentionTrace

__all__ = [
    "AttentionTrace", "CustomSpec", "FAMILIES", "family_named", "trace_model", "trace_pretrained", "DEFAULT_TEXT_A", "DEFAULT_TEXT_B", "EncoderConfig", "InputError",
    "ModelLoadError", "Models", "TraceRequest", "build_custom_model", "build_trace", "build_walkthrough", "encode",
    "load_pretrained", "select_device", "trace_custom",
]
