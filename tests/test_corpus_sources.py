"""Reading texts: the demo corpus, uploads of every kind, hub datasets, and bad input with clear messages."""

from __future__ import annotations

import json

import pytest

from model_core.corpus import CorpusInputError, demo_corpus, read_hub_dataset, read_upload, table_columns
from model_core.corpus.sources import DEMO_PATH


def test_demo_corpus_has_about_300_texts_with_pairs_and_ambiguous_words():
    corpus = demo_corpus()
    assert 280 <= len(corpus) <= 320 and corpus.has_pairs
    text = " ".join(a + " " + (b or "") for a, b in corpus.texts).lower()
    for word in ("bank", "flies", "bat", "bark"):
        assert text.count(word) >= 5, word
    assert (DEMO_PATH.parent / "README.md").is_file()


def test_txt_one_text_per_line_skips_blank_lines():
    corpus = read_upload(b"first text\n\n  second text  \r\nthird\n", "c.txt")
    assert corpus.texts == (("first text", None), ("second text", None), ("third", None))
    assert any("Skipped 1 empty" in n for n in corpus.notes)


def test_csv_and_tsv_with_text_and_pair_columns():
    data = b'id,sentence1,sentence2\n1,"Hello, world",Bye\n2,Second,\n'
    assert table_columns(data, "p.csv") == ["id", "sentence1", "sentence2"]
    corpus = read_upload(data, "p.csv", column="sentence1", pair_column="sentence2")
    assert corpus.texts == (("Hello, world", "Bye"), ("Second", None))
    tsv = read_upload(b"text\tother\nA tab\tx\n", "p.tsv")
    assert tsv.texts == (("A tab", None),)


def test_jsonl_with_default_column():
    data = "\n".join(json.dumps(r) for r in ({"text": "one", "b": "uno"}, {"text": "two", "b": None})).encode()
    assert read_upload(data, "x.jsonl", pair_column="b").texts == (("one", "uno"), ("two", None))


def test_utf8_with_bom_and_odd_unicode_are_kept():
    corpus = read_upload("\ufeffcafé ☕ <b>bold</b> 𝔘𝔫𝔦𝔠𝔬𝔡𝔢\n".encode(), "u.txt")
    assert corpus.texts[0][0] == "café ☕ <b>bold</b> 𝔘𝔫𝔦𝔠𝔬𝔡𝔢"


@pytest.mark.parametrize("data,name,message", [
    (b"", "e.txt", "is empty"),
    (b"  \n\n", "e.txt", "is empty"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00", "img.txt", "binary"),
    ("naïve".encode("latin-1"), "l.txt", "not UTF-8.*line 1"),
    (b"a,b\n1,2\n", "t.csv", "no column 'text'; its columns are: a, b"),
    (b'{"text": "ok"}\nnot json\n', "j.jsonl", "line 2 is not JSON"),
    (b'["a list"]\n', "j.jsonl", "not a JSON object"),
    (b"hello", "x.docx", "use a .txt"),
    (b"text\n\n", "t.csv", "has no texts"),
])
def test_bad_uploads_say_what_to_do(data, name, message):
    with pytest.raises(CorpusInputError, match=message):
        read_upload(data, name, column="text" if name.endswith(".csv") and b"a,b" in data else None)


def test_a_million_lines_are_capped_with_a_message():
    data = b"".join(b"line %d\n" % i for i in range(1_000_000))
    corpus = read_upload(data, "big.txt", limit=5000)
    assert len(corpus) == 5000 and corpus.total_seen == 1_000_000
    assert any("first 5,000 of 1,000,000" in n for n in corpus.notes)


def test_fingerprint_depends_on_the_texts_and_their_pairing():
    a = read_upload(b"one\ntwo\n", "a.txt")
    assert a.fingerprint == read_upload(b"one\r\ntwo", "b.txt").fingerprint
    assert a.fingerprint != read_upload(b"two\none\n", "a.txt").fingerprint
    pair = read_upload(b"text,b\none,two\n", "p.csv", pair_column="b")
    assert pair.fingerprint != read_upload(b"text\none two\n", "p.csv").fingerprint


def test_local_dataset_folder_reads_like_a_hub_id(tmp_path):
    pytest.importorskip("datasets")
    folder = tmp_path / "my_dataset"
    folder.mkdir()
    (folder / "train.jsonl").write_text("\n".join(json.dumps({"sentence": f"text {i}", "label": i}) for i in range(30)))
    corpus = read_hub_dataset(str(folder), split="train", column="sentence", limit=10)
    assert len(corpus) == 10 and corpus.texts[0] == ("text 0", None)
    assert any("first 10" in n for n in corpus.notes)
    with pytest.raises(CorpusInputError, match="no column 'nope'; its columns are: sentence, label"):
        read_hub_dataset(str(folder), column="nope")


def test_unreachable_hub_dataset_says_so(monkeypatch):
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CorpusInputError, match="cannot be reached"):
        read_hub_dataset("someone/some-dataset")
    with pytest.raises(CorpusInputError, match="Type a dataset id"):
        read_hub_dataset("  ")
