"""The model's whole context: AE_MAX_TOKENS up to 8,192, and one character cap, derived from the token limit, for
the text box, links, the command line and the trace."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from model_core.settings import (
    CHARS_PER_TOKEN_BOUND,
    HARD_MAX_TOKENS,
    MIN_TEXT_CHARS,
    Settings,
    load_settings,
    text_char_cap,
)
from model_core.families.encoding import InputError, encode_decoder

LONG_CONTEXT = 8192
WORDS = ("internationalisation characteristically institutionalised misunderstandings photosynthesis "
         "electroencephalography counterrevolutionaries incomprehensibility telecommunications "
         "responsibilities disproportionately thermodynamically interdisciplinary").split()


def _fitting(tokenizer, words: list[str], n_tokens: int) -> str:
    """The longest run of ``words`` (joined by spaces) that is at most ``n_tokens`` tokens."""
    lo, hi = 1, len(words)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(tokenizer(" ".join(words[:mid]))["input_ids"]) <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo])


@pytest.fixture(scope="module")
def long_llama(tmp_path_factory) -> Path:
    """A tiny random Llama with 8,192 positions (tests/tiny_models.py's, whose 128 are too few here)."""
    from transformers import AutoModelForCausalLM

    import tiny_models

    folder = tmp_path_factory.mktemp("long-llama")
    tokenizer = tiny_models.tiny_tokenizer(folder, add_bos=True)
    config = tiny_models._config("llama", len(tokenizer), tokenizer.convert_tokens_to_ids(tiny_models.SPECIAL_TOKEN))
    config.max_position_embeddings = LONG_CONTEXT
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    tiny_models._sharpen(model)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


@pytest.fixture(scope="module")
def long_text(long_llama) -> str:
    """Team-written English (tests/tiny_models.py's corpus, repeated) of exactly 8,192 tokens of the long Llama."""
    from transformers import AutoTokenizer

    import tiny_models

    tokenizer = AutoTokenizer.from_pretrained(long_llama)
    words = (tiny_models.CORPUS.split() * 40)
    text = _fitting(tokenizer, words, LONG_CONTEXT)
    while len(tokenizer(text)["input_ids"]) < LONG_CONTEXT:  # one word more is over: fill with a single-token word
        text += " a"
    assert len(tokenizer(text)["input_ids"]) == LONG_CONTEXT
    return text


def test_the_character_cap_is_sixteen_characters_a_token_with_a_floor():
    assert CHARS_PER_TOKEN_BOUND == 16 and MIN_TEXT_CHARS == 65_536
    assert text_char_cap(8192) == 131_072 and text_char_cap(4096) == 65_536
    assert text_char_cap(512) == MIN_TEXT_CHARS >= 60_000  # the text box's and links' cap before it was derived
    assert Settings(max_tokens=8192).max_text_chars == 131_072
    assert Settings(max_tokens=6000).max_text_chars == 96_000
    with pytest.raises(ValueError, match="positive"):
        text_char_cap(0)


def test_ae_max_tokens_goes_up_to_the_models_positions_and_no_further():
    assert load_settings({"AE_MAX_TOKENS": "8192"}).max_tokens == HARD_MAX_TOKENS == 8192
    with pytest.raises(ValueError, match="between 2 and 8192"):
        load_settings({"AE_MAX_TOKENS": "8193"})


def test_the_text_box_links_and_the_trace_share_one_cap(monkeypatch):
    import ui.state
    from ui.fields import QUERY_PARAMS, link_text_chars

    for tokens, cap in (("4096", 65_536), ("8192", 131_072)):
        monkeypatch.setenv("AE_MAX_TOKENS", tokens)
        assert link_text_chars() == ui.state.text_max_chars() == ui.state.TEXT_MAX_CHARS == cap
        text = "w" * cap
        assert QUERY_PARAMS["text_a"][1](text) == text
        with pytest.raises(ValueError, match="longer than"):
            QUERY_PARAMS["text_a"][1](text + "w")
        data, note = ui.state.text_from_upload(("w" * (cap + 7)).encode(), "long.txt")
        assert len(data) == cap and f"{cap:,}" in note


def test_an_old_link_of_60000_characters_opens_under_a_small_limit(monkeypatch):
    from ui.fields import QUERY_PARAMS

    monkeypatch.setenv("AE_MAX_TOKENS", "512")
    text = "word " * 12_000  # 60,000 characters: the most a link carried before the cap was derived
    assert QUERY_PARAMS["text_a"][1](text) == text


def test_a_4096_token_document_of_long_words_is_accepted():
    from transformers import AutoTokenizer

    from model_core.models.bundled import ensure_bundled_decoder

    tokenizer = AutoTokenizer.from_pretrained(ensure_bundled_decoder())
    text = _fitting(tokenizer, WORDS * 1000, 4096)
    assert len(text) > 20_000  # refused by the old 20,000-character cap
    encoded = encode_decoder(tokenizer, text, max_tokens=4096)
    assert 4000 < encoded.input_ids.shape[1] <= 4096 and not encoded.truncated
    with pytest.raises(InputError, match="tokens; the limit is 4000"):  # the token limit stays the real one
        encode_decoder(tokenizer, text, max_tokens=4000)


def test_a_5_mb_paste_is_refused_at_once_with_the_cap(long_llama):
    from transformers import AutoTokenizer

    real = AutoTokenizer.from_pretrained(long_llama)
    paste = "The river rose in the night. " * 180_000  # 5.2 MB

    class Untouchable:
        """The tokenizer's attributes, but tokenizing fails: the cap must refuse the paste before any tokenizing
        (which is what makes it immediate; bench/bench_checks.py times it)."""

        def __getattr__(self, name):
            if name in ("encode", "encode_plus", "batch_encode_plus", "tokenize", "backend_tokenizer", "_tokenizer"):
                pytest.fail(f"the 5 MB paste reached the tokenizer's {name} before the character cap refused it")
            return getattr(real, name)

        def __call__(self, *args, **kwargs):
            pytest.fail("the 5 MB paste was tokenized before the character cap refused it")

    with pytest.raises(InputError) as refused:
        encode_decoder(Untouchable(), paste, max_tokens=8192, truncate=True, limit_hint=" (AE_MAX_TOKENS)")
    assert str(refused.value) == (f"The text has {len(paste)} characters, more than 131,072: 16 characters a token "
                                  "for the limit of 8,192 tokens (AE_MAX_TOKENS). Paste a shorter passage.")


def test_a_corpus_encoding_with_no_token_limit_still_has_a_cap(long_llama):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(long_llama)
    with pytest.raises(InputError, match="more than 131,072"):
        encode_decoder(tokenizer, "x" * 131_073, max_tokens=10**9)


@pytest.mark.slow
def test_an_8192_token_text_is_traced_with_ae_max_tokens_8192(long_llama, long_text, monkeypatch):
    from model_core.compact.build import build_compact, trace_form
    from model_core.trace.request import Models, TraceRequest

    monkeypatch.setenv("AE_MAX_TOKENS", "8192")
    request = TraceRequest("pretrained", long_text, model_id=str(long_llama))
    assert len(long_text) > 20_000
    models = Models()
    assert trace_form(request, device="cpu", models=models).compact
    trace = build_compact(request, device="cpu", models=models, predictions=False, largest_weight=False)
    assert trace.n_tokens == LONG_CONTEXT
    rows, cols = slice(LONG_CONTEXT - 3, LONG_CONTEXT), slice(0, LONG_CONTEXT)
    window = trace.weights(1, 2, rows, cols)
    np.testing.assert_allclose(window.sum(-1), 1.0, atol=1e-4)
    monkeypatch.setenv("AE_MAX_TOKENS", "4096")
    with pytest.raises(InputError, match="has 8192 tokens; the limit is 4096 \\(AE_MAX_TOKENS"):
        build_compact(request, device="cpu", models=models)


@pytest.mark.slow
def test_export_compact_takes_an_8192_token_text_on_the_command_line(long_llama, long_text, tmp_path, capsys):
    from model_core.cli.main import main

    path = tmp_path / "long.txt"
    path.write_text(long_text, encoding="utf-8")
    out = tmp_path / "long.npz"
    assert main(["export", "--model", "pretrained", "--model-id", str(long_llama), "--text-file", str(path),
                 "--compact", "--max-tokens", "8192", "--out", str(out)]) == 0
    assert "8192 tokens" in capsys.readouterr().out and out.exists()


@pytest.mark.parametrize("n", [1, 2, 5, 300, 600])
def test_the_build_works_out_each_mask_as_layer_mask_of_does(n):
    from model_core.compact.build import _layer_mask
    from model_core.compact.trace import LayerMask

    torch.manual_seed(n)
    tril = torch.ones(n, n, dtype=torch.bool).tril()
    window = tril & ~torch.ones(n, n, dtype=torch.bool).tril(-4)
    additive = torch.zeros(n, n).masked_fill(~window, torch.finfo(torch.float32).min)
    cases = [(None, True, tril), (None, False, torch.ones(n, n, dtype=torch.bool)), (tril[None, None], True, tril),
             (window[None, None], True, window), (additive[None, None], True, window)]
    random = torch.rand(n, n) > 0.5
    cases.append((random[None, None], False, random))
    for raw, causal, allowed in cases:
        ours, reference = _layer_mask(raw, n, causal), LayerMask.of(allowed)
        assert torch.equal(ours.allowed, reference.allowed)
        assert (ours.future, ours.causal) == (reference.future, reference.causal)
        assert torch.equal(ours.choosing, reference.choosing)


PAGES_AT_8192 = ("home", "heatmaps", "causal", "inside", "bertviz", "analysis_contexts", "analysis_head_stats",
                 "analysis_masking", "analysis_norms", "analysis_rollout", "head_roles", "predictions", "corpus",
                 "corpus_space")
"""The pages that were there before the whole context: each works at 8,192 tokens or says its limit."""
SAYS_ITS_LIMIT = ("shows inputs of up to", "need a full trace, of up to")


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES_AT_8192)
def test_every_page_works_at_8192_tokens_or_says_its_limit(long_llama, long_text, monkeypatch, page):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("AE_MAX_TOKENS", "8192")
    at = AppTest.from_file(str(Path(__file__).resolve().parents[1] / "app.py"), default_timeout=600)
    for name, value in {"model": "pretrained", "model_id": str(long_llama), "a": long_text, "b": ""}.items():
        at.query_params[name] = value
    at.run()
    at.switch_page(f"pages/{page}.py")
    at.run()
    if page == "analysis_rollout":  # rollout into a token is computed on a click
        at.button(key="compact_rollout_run").click()
        at.run()
    assert not at.exception, [e.value for e in at.exception]
    ctx = at.session_state["_app_context"]
    assert ctx.compact is not None and ctx.compact.n_tokens == LONG_CONTEXT, ctx.error
    said = " ".join(i.value for i in at.info)
    assert at.get("plotly_chart") or any(s in said for s in SAYS_ITS_LIMIT), said
    assert "Type a sentence" not in said
