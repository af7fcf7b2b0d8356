"""Reading texts: the demo corpus, uploads of every kind, hub datasets, and bad input with clear messages."""

from __future__ import annotations

import json

import pytest

from model_core.corpus import CorpusInputError, demo_corpus, read_hub_dataset, read_path, read_upload, table_columns
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


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "utf-8", "utf-32-le"])
def test_a_text_saved_with_a_byte_order_mark_is_read(tmp_path, encoding):
    """Windows Notepad's "Unicode" is UTF-16 LE with a byte-order mark and CRLF line ends; its "UTF-8 with BOM"
    starts with the UTF-8 mark."""
    path = tmp_path / "notepad.txt"
    path.write_bytes("\ufefftime flies like an arrow\r\ncafé ☕\r\n".encode(encoding))
    assert read_path(path).texts == (("time flies like an arrow", None), ("café ☕", None))
    table = tmp_path / "notepad.tsv"
    table.write_bytes("\ufefftext\tlabel\r\nfruit flies\tx\r\n".encode(encoding))
    assert table_columns(table.read_bytes(), table.name) == ["text", "label"]
    assert read_path(table).texts == (("fruit flies", None),)


def test_utf16_without_a_byte_order_mark_names_the_encoding(tmp_path):
    path = tmp_path / "nomark.txt"
    path.write_bytes("time flies\n".encode("utf-16-le"))
    with pytest.raises(CorpusInputError, match="If it is UTF-16 text without a byte-order mark, save it as UTF-8"):
        read_path(path)


def test_an_unterminated_quote_in_a_csv_is_refused_not_merged_into_one_text(tmp_path):
    path = tmp_path / "quotes.csv"
    path.write_text('text,label\n"Hello, world",1\n"never closed,2\nthird text,3\nfourth text,4\n')
    with pytest.raises(CorpusInputError, match=r'line 3: a quote \(\"\) opens a field that is never closed, so lines '
                                               r"3-5 would all be one text"):
        read_path(path)
    fine = tmp_path / "multiline.csv"  # a closed quote may span lines
    fine.write_text('text,label\n"Hello, world",1\n"two\nlines",2\n')
    assert read_path(fine).texts == (("Hello, world", None), ("two\nlines", None))


def test_a_tsv_without_a_tab_says_its_one_line_is_the_header(tmp_path):
    path = tmp_path / "one.tsv"
    path.write_text("time flies like an arrow\n")
    with pytest.raises(CorpusInputError, match="its only non-empty line, 'time flies like an arrow', is the header "
                                               "row a .tsv file starts with") as info:
        read_path(path)
    assert "every line or row was empty" not in str(info.value) and "no tab" in str(info.value)


def test_a_tsv_without_a_tab_is_read_as_one_column_and_says_so(tmp_path):
    path = tmp_path / "lines.tsv"
    path.write_text("time flies like an arrow\nfruit flies like a banana\n")
    corpus = read_path(path)
    assert corpus.texts == (("fruit flies like a banana", None),)
    assert any("has no tab: read as one column" in n and "'time flies like an arrow'" in n for n in corpus.notes)
    headed = tmp_path / "headed.tsv"  # a one-column table with a header is normal: no note
    headed.write_text("text\nfruit flies like a banana\n")
    assert read_path(headed).notes == ()
