"""model_core: the from-scratch encoder, pretrained BERT loading, and one AttentionTrace for both."""

from model_core.config import EncoderConfig
from model_core.loading import ModelLoadError, load_pretrained, select_device
from model_core.trace import AttentionTrace
from model_core.tracing import (
    DEFAULT_TEXT_A,
    DEFAULT_TEXT_B,
    CustomSpec,
    InputError,
    build_custom_model,
    build_trace,
    encode,
    trace_bert,
    trace_custom,
)

__all__ = [
    "AttentionTrace", "CustomSpec", "DEFAULT_TEXT_A", "DEFAULT_TEXT_B", "EncoderConfig", "InputError",
    "ModelLoadError", "build_custom_model", "build_trace", "encode", "load_pretrained", "select_device",
    "trace_bert", "trace_custom",
]
