"""Words, not WordPieces: the grouping of pieces and Clark et al.'s merge rule, on the real tokenizer."""

from __future__ import annotations

import numpy as np
import pytest

from model_core import TraceRequest, build_trace
from model_core.words import WordSpans, piece_text, span_text, word_spans

SPLIT = "the embeddings of unaffordable tokenizers"


@pytest.fixture(scope="module")
def split_trace():
    trace = build_trace(TraceRequest("bert", SPLIT, "they split"))
    assert any(t.startswith("##") for t in trace.tokens), trace.tokens
    return trace


def test_pieces_group_into_words_and_specials_stay_alone():
    words = word_spans(["[CLS]", "em", "##bed", "##ding", "##s", "are", "[SEP]", "##x", "[SEP]"])
    assert words.words == ("[CLS]", "embeddings", "are", "[SEP]", "##x", "[SEP]")
    assert words.spans == ((0, 1), (1, 5), (5, 6), (6, 7), (7, 8), (8, 9))
    assert words.word_of(3) == 1 and words.word_start(5) == 2 and words.word_start(None) is None
    with pytest.raises(ValueError, match="outside"):
        words.word_of(9)


def test_merge_equals_a_naive_loop_over_words(split_trace):
    words = word_spans(split_trace.tokens)
    assert words.any_split
    a = split_trace.weights[2, 5]
    expected = np.zeros((words.n_words, words.n_words))
    for i, (qa, qb) in enumerate(words.spans):
        for j, (ka, kb) in enumerate(words.spans):
            expected[i, j] = np.mean([a[q, ka:kb].sum() for q in range(qa, qb)])
    np.testing.assert_allclose(words.merge(a), expected, atol=1e-6)
    # A stack of heads merges head by head.
    np.testing.assert_allclose(words.merge(split_trace.weights)[2, 5], expected, atol=1e-6)


def test_merged_rows_still_sum_to_one(split_trace):
    merged = word_spans(split_trace.tokens).merge(split_trace.weights)
    np.testing.assert_allclose(merged.sum(-1), 1.0, atol=1e-5)


def test_a_text_without_split_words_changes_only_in_its_labels():
    trace = build_trace(TraceRequest("bert", "time flies like an arrow", "fruit flies like a banana"))
    words = word_spans(trace.tokens)
    assert not words.any_split and words.words == trace.tokens
    np.testing.assert_allclose(words.merge(trace.weights), trace.weights, atol=1e-6)


def test_pieces_read_as_the_text_reads():
    assert span_text(["The", "Ġriver", "Ġrose", ".", "Ċ", "It", "Ġfell"]) == "The river rose.\nIt fell"
    assert span_text(["▁time", "▁flies"]) == "time flies"
    assert span_text(["[CLS]", "un", "##believ", "##able", "weir", "##fish"]) == "[CLS] unbelievable weirfish"
    assert piece_text("Ġthe") == " the" and piece_text("##ing") == "##ing"


def test_word_spans_reject_gaps():
    with pytest.raises(ValueError, match="tile"):
        WordSpans(("a", "b"), ((0, 1), (2, 3)), 3)


def test_export_words_adds_the_word_keys_to_npz_and_json(tmp_path):
    import json

    from harness.cli import run_cli  # the tests' harness: the command line in this process

    for suffix in ("npz", "json"):
        out = tmp_path / f"t.{suffix}"
        done = run_cli("export", "--model", "bert", "--text", SPLIT, "--words", "--out", str(out))
        assert done.returncode == 0, done.stderr
        data = dict(np.load(out)) if suffix == "npz" else json.loads(out.read_text())
        words, spans = list(data["words"]), np.asarray(data["word_spans"])
        merged = np.asarray(data["word_attentions"], dtype=np.float32)
        tokens = list(data["tokens"])
        assert "embeddings" in words and len(words) < len(tokens)
        assert merged.shape[2:] == (len(words), len(words)) and spans.shape == (len(words), 2)
        assert all(words[w] == "".join(t.removeprefix("##") for t in tokens[a:b]) for w, (a, b) in enumerate(spans))
        np.testing.assert_allclose(merged, word_spans(tokens).merge(np.asarray(data["attentions"])), atol=1e-5)
    plain = tmp_path / "plain.npz"
    assert run_cli("export", "--model", "bert", "--text", SPLIT, "--out", str(plain)).returncode == 0
    assert "words" not in np.load(plain).files


def test_aggregates_equal_numpys_mean_and_max(split_trace):
    from model_core.analysis.aggregate import aggregate_heads

    a = split_trace.weights
    np.testing.assert_allclose(aggregate_heads(a, "layer_mean", 3), a[3].mean(0), atol=1e-6)
    np.testing.assert_array_equal(aggregate_heads(a, "layer_max", 3), a[3].max(0))
    np.testing.assert_allclose(aggregate_heads(a, "all_mean"), a.mean((0, 1)), atol=1e-6)
    np.testing.assert_array_equal(aggregate_heads(a, "head", 2, 7), a[2, 7])
    np.testing.assert_allclose(aggregate_heads(a, "layer_mean", 1).sum(-1), 1.0, atol=1e-5)
    with pytest.raises(ValueError, match="how must be"):
        aggregate_heads(a, "median")


def test_the_selections_rows_are_the_mean_of_the_selected_rows(split_trace):
    from model_core.analysis.aggregate import selection_attention

    a = split_trace.weights
    sent = selection_attention(a, [4, 1, 4, 2], "sent")
    np.testing.assert_allclose(sent, a[:, :, [1, 2, 4], :].mean(2), atol=1e-6)
    np.testing.assert_allclose(sent.sum(-1), 1.0, atol=1e-5)
    received = selection_attention(a, [1, 2], "received")
    np.testing.assert_allclose(received, a[:, :, :, 1] + a[:, :, :, 2], atol=1e-6)
    with pytest.raises(ValueError, match="Select at least one"):
        selection_attention(a, [], "sent")
    with pytest.raises(ValueError, match="positions 0-"):
        selection_attention(a, [999], "sent")


def test_the_word_level_trace_carries_the_merged_weights_and_the_words(split_trace):
    from model_core.words import word_level_trace

    words = word_spans(split_trace.tokens)
    merged = word_level_trace(split_trace, words)
    assert merged.tokens == words.words and merged.n_tokens == words.n_words
    np.testing.assert_allclose(merged.weights, words.merge(split_trace.weights), atol=1e-6)
    assert merged.sentence_b_start == words.word_of(split_trace.sentence_b_start)
    assert merged.tokens[merged.sentence_b_start] == "they"


def test_with_words_on_the_maximum_over_heads_is_taken_over_the_word_matrices(split_trace):
    """Merging after the maximum would sum the pieces' maxima; the view takes the maximum of the merged heads."""
    from model_core import TraceRequest
    from ui.context import make_context

    words = word_spans(split_trace.tokens)
    request = TraceRequest("pretrained", " ".join(split_trace.tokens))  # names the trace; make_context holds it
    ctx = make_context(request, None, split_trace, None, words=words)
    merged = words.merge(split_trace.weights)
    np.testing.assert_array_equal(ctx.aggregate("layer_max", 2), merged[2].max(0))
    np.testing.assert_allclose(ctx.aggregate("layer_mean", 2), words.merge(split_trace.weights[2].mean(0)),
                               atol=1e-6)
    np.testing.assert_array_equal(ctx.aggregate("head", 2, 5), merged[2, 5])
    assert ctx.labels() == (words.words, words.word_start(split_trace.sentence_b_start))
    plain = make_context(request, None, split_trace, None)
    np.testing.assert_array_equal(plain.aggregate("layer_max", 2), split_trace.weights[2].max(0))
    assert plain.labels() == (split_trace.tokens, split_trace.sentence_b_start)


def _byte_level(text: str, cuts: list[int]) -> list[str]:
    """``text`` as byte-level BPE pieces cut at the byte offsets ``cuts``, encoded with transformers' own table."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    table = bytes_to_unicode()
    data = text.encode("utf-8")
    bounds = [0, *cuts, len(data)]
    return ["".join(table[b] for b in data[a:z]) for a, z in zip(bounds, bounds[1:])]


def test_byte_level_pieces_read_as_their_text():
    from model_core.words import is_byte_level, readable_tokens

    text = "time flies café\nłódź 日本"
    data = text.encode("utf-8")
    cuts = [i for i in range(1, len(data)) if data[i] < 0x80 or data[i] >= 0xC0]  # every character a piece
    pieces = _byte_level(text, cuts)
    assert "Ġ" in pieces and "Ã©" in pieces and is_byte_level(pieces)
    shown = readable_tokens(pieces, "bpe")
    assert "".join(shown) == "time␣flies␣café↵łódź␣日本"
    assert span_text(pieces) == text


def test_a_piece_that_ends_inside_a_character_shows_its_bytes():
    from model_core.words import readable_tokens

    pieces = _byte_level(" 日", [2])  # the space and the character's first byte, then its last two bytes
    assert readable_tokens(pieces, "bpe") == ("␣\\xe6", "\\x97\\xa5")


def test_sentencepiece_and_wordpiece_pieces_keep_their_letters():
    from model_core.words import is_byte_level, readable_tokens

    sentencepiece = ["▁łódź", "▁Ġużeppi", "▁café"]  # real letters that byte-level BPE also uses as marks
    assert not is_byte_level(sentencepiece)
    assert readable_tokens(sentencepiece, "bpe") == ("␣łódź", "␣Ġużeppi", "␣café")
    wordpiece = ["[CLS]", "Ġużeppi", "##ing", "[SEP]"]
    assert readable_tokens(wordpiece, "wordpiece") == tuple(wordpiece)


def test_a_special_token_of_other_characters_leaves_the_text_byte_level():
    from dataclasses import replace

    trace = build_trace(TraceRequest("custom", "time flies", num_hidden_layers=1, num_attention_heads=2,
                                     hidden_size=16))
    bos = "<｜begin▁of▁sentence｜>"  # DeepSeek's: full-width bars and SentencePiece's space, no byte-level alphabet
    pieces = (bos, "Hello", "Ġworld", "Ã©")
    decoder = replace(trace, tokens=pieces, token_ids=np.arange(4), token_type_ids=np.zeros(4, dtype=np.int64),
                      weights=np.tile(np.eye(4, dtype=np.float32), (1, 2, 1, 1)), mask=np.ones((4, 4), bool),
                      queries=np.zeros((1, 2, 4, 8), np.float32), keys=np.zeros((1, 2, 4, 8), np.float32),
                      values=np.zeros((1, 2, 4, 8), np.float32), value_norms=np.zeros((1, 2, 4), np.float32),
                      hidden_states=np.zeros((2, 4, 16), np.float32), model_kind="llama",
                      special_tokens=frozenset({bos}), sentence_b_start=None, logits=None)
    assert decoder.byte_level and decoder.labels == (bos, "Hello", "␣world", "é")


def test_wordpiece_letters_are_never_read_as_byte_level_marks():
    assert span_text(["[CLS]", "č", "##as", "[SEP]"]) == "[CLS] čas [SEP]"
    assert span_text(["▁Ćma"]) == "Ćma"  # SentencePiece: the letter stays


def test_token_text_is_escaped_for_markdown():
    from model_core.words import markdown_text

    assert markdown_text("*a_b$c") == "\\*a\\_b\\$c" and markdown_text("flies") == "flies"
