"""Fuzz the text -> trace path: any string gives a valid trace or a clear InputError, never a crash."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from model_core import InputError, TraceRequest, build_trace
from model_core.settings import Settings
from model_core.families.encoding import MAX_TEXT_CHARS

# Every Unicode category hypothesis draws (control and private-use included), plus hostile snippets;
# lone surrogates, which hypothesis does not draw, are among the snippets.
ANY_CHAR = st.characters(codec=None, categories=None)
HOSTILE = st.sampled_from([
    "<script>alert(1)</script>", '"><img src=x onerror=alert(1)>', "{{7*7}}", "\u202e\u05e9\u05dc\u05d5\u05dd",
    "\u200b\u200d\ufeff", "\x00\x07\x1b[31m", "😀👩‍👩‍👧", "注意力机制", "مرحبا", "\u0301\u0301", "   \n\t", "\ud800", "\udfff",
])
TEXT = st.one_of(
    st.text(ANY_CHAR, max_size=40),
    st.lists(st.one_of(HOSTILE, st.text(ANY_CHAR, max_size=8)), max_size=6).map("".join),
    st.text(st.sampled_from("ab .,!?é中😀\u200b\x00"), min_size=0, max_size=700),  # long-ish: past the token limit
)
SMALL = Settings(max_tokens=64)
_COMMON = dict(deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
FUZZ = settings(max_examples=40, **_COMMON)
FUZZ_BERT = settings(max_examples=20, **_COMMON)  # each example is a real MiniLM forward pass


def _check(make) -> None:
    """``make()`` either returns a valid trace or raises InputError with a message for the user."""
    try:
        trace = make()
    except InputError as exc:
        msg = str(exc)
        assert msg and "Traceback" not in msg and len(msg) < 300, msg
        return
    n = trace.n_tokens
    assert all(isinstance(t, str) and t for t in trace.tokens)
    assert trace.tokens[0] == "[CLS]" and trace.tokens[-1] == "[SEP]"
    assert 3 <= n <= SMALL.max_tokens
    assert trace.weights.shape[2:] == (n, n)
    assert np.isfinite(trace.weights).all()
    np.testing.assert_allclose(trace.weights.sum(-1), 1.0, atol=1e-4)
    assert trace.hidden_states.shape[1] == n and trace.value_norms.shape[-1] == n


@FUZZ
@given(a=TEXT, b=st.one_of(st.none(), TEXT))
def test_custom_encoder_traces_any_text_or_says_why(a, b):
    _check(lambda: build_trace(TraceRequest("custom", a, b, num_hidden_layers=1, num_attention_heads=2, hidden_size=16), device="cpu", settings=SMALL))


@pytest.mark.slow
@FUZZ_BERT
@given(a=TEXT, b=st.one_of(st.none(), TEXT))
def test_bundled_bert_traces_any_text_or_says_why(a, b):
    _check(lambda: build_trace(TraceRequest("bert", a, b), device="cpu", settings=SMALL))


def test_known_hostile_inputs_give_the_expected_outcome():
    """The fuzz strategies must reach both outcomes; these fixed cases pin the important ones."""
    def outcome(a, b=None):
        try:
            return build_trace(TraceRequest("custom", a, b, num_hidden_layers=1, num_attention_heads=2, hidden_size=16), device="cpu", settings=SMALL).tokens
        except InputError as exc:
            return str(exc)

    assert outcome("") == "The text is empty; type a sentence."
    assert outcome(" \t\n\u200b\ufeff\x00") == "The text is empty; type a sentence."
    assert outcome("\u0301").startswith("Sentence A gives no tokens")
    assert outcome("hi", "\u0301").startswith("Sentence B gives no tokens")
    assert outcome("\ud800word") == ("[CLS]", "word", "[SEP]")  # a lone surrogate is dropped, not a TypeError
    assert outcome("a " * 100).startswith("The input has 102 tokens; the limit is 64 (AE_MAX_TOKENS")
    assert outcome("x" * (MAX_TEXT_CHARS + 1)).startswith(f"The text has {MAX_TEXT_CHARS + 1} characters")
    assert "<" in outcome("<script>alert(1)</script>") and "script" in outcome("<script>alert(1)</script>")
