"""The whole analysis of a trace as named arrays, for the one NPZ/JSON writer (``model_core.io.export``; CSV is
``model_core.io.tables``).

The analyses exported here come from Abnar & Zuidema (2020), Kobayashi et al. (2020) and Clark et
al. (2019); see the modules ``rollout``, ``norms`` and ``per_head``.
"""

from __future__ import annotations

import numpy as np

from model_core.analysis.per_head import head_stats
from model_core.analysis.norms import norm_weighted_attention, special_token_mass
from model_core.analysis.rollout import FLOW_MAX_TOKENS, attention_flow, attention_rollout
from model_core.trace.trace import AttentionTrace


JSON_MAX_TOKENS_PER_HEAD = 64
"""Past this many tokens the JSON export leaves out the (layer, head, q_pos, k_pos) arrays (hundreds of MB)."""


def analysis_arrays(trace: AttentionTrace, *, per_head_matrices: bool = True) -> dict[str, np.ndarray]:
    """Every analysis of one trace that needs no extra input, as named arrays.

    Keys: tokens; norm_weighted (layer, head, q_pos, k_pos), unless ``per_head_matrices`` is
    False; rollout (layer, q_pos, k_pos); flow (q_pos, k_pos; raw max-flow values, only up to
    ``FLOW_MAX_TOKENS`` tokens); special_mass/<raw|norm>_<cls|sep> (layer, head); and every head
    statistic as head_stats/<name> (layer, head).
    """
    arrays: dict[str, np.ndarray] = {"tokens": np.asarray(trace.tokens)}
    if per_head_matrices:
        arrays["norm_weighted"] = norm_weighted_attention(trace.weights, trace.value_norms).astype(np.float32)
    arrays["rollout"] = attention_rollout(trace.weights, trace.head_mask).astype(np.float32)
    if trace.n_tokens <= FLOW_MAX_TOKENS:
        arrays["flow"] = attention_flow(trace.weights, trace.head_mask).astype(np.float32)
    mass = special_token_mass(trace)
    for name in ("raw_cls", "raw_sep", "norm_cls", "norm_sep"):
        arrays[f"special_mass/{name}"] = getattr(mass, name)
    for name, grid in head_stats(trace).to_dict().items():
        arrays[f"head_stats/{name}"] = grid
    return arrays
