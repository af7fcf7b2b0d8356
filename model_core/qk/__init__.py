"""Why a head attends where it does, from the query-key side: composition scores of every pair of heads
(``composition``, from the weights alone). No streamlit here."""

from model_core.qk.composition import (
    KIND_TITLES,
    KINDS,
    CompositionPair,
    CompositionScores,
    composition_for_request,
    composition_scores,
    fold_heads,
    random_baseline,
)

__all__ = ["KINDS", "KIND_TITLES", "CompositionPair", "CompositionScores", "composition_for_request",
           "composition_scores", "fold_heads", "random_baseline"]
