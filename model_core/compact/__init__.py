"""Long traces: the compact trace (queries, keys and each row's log-sum-exp; any window exact on demand), its streamed
summary and its views. ``CompactTrace`` and ``load_compact`` are importable from here, as they were before the split."""

from model_core.compact.trace import CompactFormatError, CompactTrace, load_compact

__all__ = ["CompactFormatError", "CompactTrace", "load_compact"]
