"""model_core: the from-scratch encoder, pretrained BERT loading, and one AttentionTrace for both."""

from model_core.config import EncoderConfig
from model_core.custom_spec import CustomSpec, build_custom_model
from model_core.encoding import DEFAULT_TEXT_A, DEFAULT_TEXT_B, InputError, encode
from model_core.forward import trace_bert, trace_custom
from model_core.loading import ModelLoadError, load_pretrained, select_device
from model_core.request import Models, TraceRequest, build_trace, build_walkthrough
from model_core.trace import AttentionTrace

__all__ = [
    "AttentionTrace", "CustomSpec", "DEFAULT_TEXT_A", "DEFAULT_TEXT_B", "EncoderConfig", "InputError",
    "ModelLoadError", "Models", "TraceRequest", "build_custom_model", "build_trace", "build_walkthrough", "encode",
    "load_pretrained", "select_device", "trace_bert", "trace_custom",
]
