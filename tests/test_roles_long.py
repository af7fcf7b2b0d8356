"""Head roles on a long input's compact trace equal the same roles on the full trace of the same text."""

from __future__ import annotations

import numpy as np
import pytest

from model_core import TraceRequest, build_trace
from model_core.analysis._common import trace_flags
from model_core.compact.build import build_compact
from model_core.roles import role_scores
from model_core.roles.long_text import compact_role_scores, duplicate_pairs

# Repeated phrases, as a long document has them: duplicate tokens and induction pairs.
TEXT = ("the heron stood by the weir and the heron watched the water . "
        "children counted stones by the weir while the heron watched . ")


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_long_text_roles_equal_the_full_traces(tiny_decoders, family):
    request = TraceRequest("pretrained", TEXT, model_id=str(tiny_decoders[family]))
    full, compact = build_trace(request, device="cpu"), build_compact(request, device="cpu")
    special = trace_flags(full)["special"]
    expected = role_scores(full, ("previous_token", "duplicate_token", "sink", "induction"))
    done = []
    got = compact_role_scores(compact, special, progress=done.append)
    for role, grid in expected.items():
        assert np.isfinite(grid).all(), role  # the text repeats: every role has a score
        np.testing.assert_allclose(got[role], grid, atol=1e-5, err_msg=role)
    assert done and done[-1] == pytest.approx(1.0) and done == sorted(done)


def test_duplicate_pairs_are_earlier_copies_on_a_decoder_and_all_copies_on_an_encoder():
    ids, special = np.array([5, 7, 5, 5, 9]), np.zeros(5, dtype=bool)
    q, k = duplicate_pairs(ids, special, causal=True)
    assert sorted(zip(q.tolist(), k.tolist())) == [(2, 0), (3, 0), (3, 2)]
    q, k = duplicate_pairs(ids, special, causal=False)
    assert len(q) == 6 and (2, 3) in set(zip(q.tolist(), k.tolist()))
    special[0] = True  # a special token is no copy
    q, k = duplicate_pairs(ids, special, causal=True)
    assert sorted(zip(q.tolist(), k.tolist())) == [(3, 2)]
