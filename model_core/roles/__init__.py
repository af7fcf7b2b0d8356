"""What each head does: previous-token, duplicate-token, induction, sink and retrieval scores for every head.

``probes`` draws the repeated random sequences and scores them (``score_roles``), ``scores`` scores one trace,
``retrieval`` runs the needle-in-a-haystack decoding (``retrieval_scores``). No streamlit here.
"""

from model_core.roles.probes import (
    ENCODER_NOTES,
    N_SEQUENCES,
    ROLE_TITLES,
    SEQ_LEN,
    RoleScores,
    probe_request,
    probe_texts,
    score_roles,
    word_pool,
)
from model_core.roles.retrieval import DEPTHS, RetrievalResult, retrieval_scores
from model_core.roles.scores import (
    PROBE_ROLES,
    TEXT_ROLES,
    RoleInput,
    duplicate_token_scores,
    induction_scores,
    role_scores,
)

ROLES: tuple[str, ...] = (*PROBE_ROLES, "retrieval")

__all__ = [
    "DEPTHS",
    "ENCODER_NOTES",
    "N_SEQUENCES",
    "PROBE_ROLES",
    "ROLES",
    "ROLE_TITLES",
    "SEQ_LEN",
    "TEXT_ROLES",
    "RetrievalResult",
    "RoleInput",
    "RoleScores",
    "duplicate_token_scores",
    "induction_scores",
    "probe_request",
    "probe_texts",
    "retrieval_scores",
    "role_scores",
    "score_roles",
    "word_pool",
]
