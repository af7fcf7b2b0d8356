"""Analyses beyond raw attention: contexts, rollout and flow, norm-weighted attention, head statistics,
head masking (and a decoder's next-token prediction), export. Pure numpy (and scipy's max-flow; torch only
inside ``next_token_probs``); see each module for its paper. Each asks the trace which positions are its
family's markers (``markers``, ``trace_flags``): [CLS]/[SEP] for an encoder, the first token for a decoder."""

from model_core.analysis._common import Markers, markers, trace_flags
from model_core.analysis.contexts import (
    ContextComparison,
    WordSpan,
    compare_contexts,
    compare_word,
    find_occurrences,
    repeated_words,
    text_words,
)
from model_core.analysis.export import analysis_arrays
from model_core.analysis.per_head import (
    STAT_NAMES,
    STAT_TITLES,
    TRACE_STAT_NAMES,
    HeadStats,
    head_stats,
    stat_titles,
)
from model_core.analysis.masking import MaskingEffect, compare_masking, head_mask_from_off
from model_core.analysis.next_token import NextTokenEffect, next_token_effect, next_token_probs
from model_core.analysis.norms import SpecialTokenMass, norm_weighted_attention, special_token_mass
from model_core.analysis.rollout import (
    FLOW_MAX_TOKENS,
    FLOW_MAX_TOKENS_ONE_ROW,
    RolloutResult,
    attention_flow,
    attention_rollout,
    check_flow_size,
    mixed_attention,
    normalize_rows,
    rollout_and_flow,
)

__all__ = [
    "FLOW_MAX_TOKENS",
    "FLOW_MAX_TOKENS_ONE_ROW",
    "STAT_NAMES",
    "TRACE_STAT_NAMES",
    "STAT_TITLES",
    "ContextComparison",
    "HeadStats",
    "Markers",
    "MaskingEffect",
    "NextTokenEffect",
    "RolloutResult",
    "SpecialTokenMass",
    "WordSpan",
    "analysis_arrays",
    "attention_flow",
    "attention_rollout",
    "check_flow_size",
    "compare_contexts",
    "compare_masking",
    "compare_word",
    "find_occurrences",
    "head_mask_from_off",
    "head_stats",
    "markers",
    "mixed_attention",
    "next_token_effect",
    "next_token_probs",
    "norm_weighted_attention",
    "normalize_rows",
    "repeated_words",
    "rollout_and_flow",
    "special_token_mass",
    "stat_titles",
    "trace_flags",
    "text_words",
]
