"""Datasets of prompt pairs for circuits: the team's generators hold for the bundled SmolLM2's tokenizer and repeat
with their seed; specs, JSONL and CSV files are read, and every bad input gets a message naming the pair and its
pieces while the valid pairs still run."""

from __future__ import annotations

import json

import pytest

from model_core.circuits.datasets import (
    Dataset,
    DatasetError,
    Pair,
    load_dataset,
    parse_pairs,
    parse_spec,
    validate,
)
from model_core.circuits.generators import GENERATORS, generate

TOKENS = {"ioi": 15, "greater-than": 17, "induction": 15, "facts": 6}
"""Each generator's one token count for SmolLM2: its prompts share a template."""
GOOD = Pair("When Mary and John went to the store, John gave a drink to",
            "When Mary and John went to the store, Mary gave a drink to", " Mary", " John")


@pytest.fixture(scope="module")
def smol_tokenizer():
    from transformers import AutoTokenizer

    from model_core.models.bundled import ensure_bundled_decoder

    return AutoTokenizer.from_pretrained(str(ensure_bundled_decoder()), local_files_only=True)


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_every_generated_pair_is_valid_for_smollm2_with_one_token_count(smol_tokenizer, name):
    checked = validate(generate(name, 300, 7), smol_tokenizer)
    assert checked.messages == []
    assert len(checked.pairs) == 300
    assert checked.n_tokens == TOKENS[name]
    for tok in checked.pairs[:50]:  # the prompts exactly as tokenizer(text).input_ids
        assert list(tok.clean_ids) == smol_tokenizer(tok.pair.clean).input_ids
        assert tok.answer_id != tok.foil_id


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_a_seed_gives_the_same_pairs_and_another_seed_others(name):
    assert generate(name, 25, 3) == generate(name, 25, 3)
    assert generate(name, 25, 3) != generate(name, 25, 4)
    assert generate(name, 10, 3) == generate(name, 25, 3)[:10]  # a longer run of the same seed extends it


@pytest.mark.parametrize("name", ["ioi", "induction", "facts"])
def test_the_corruption_changes_one_token_and_swaps_answer_and_foil(smol_tokenizer, name):
    for tok in validate(generate(name, 40, 1), smol_tokenizer).pairs:
        differing = [i for i, (a, b) in enumerate(zip(tok.clean_ids, tok.corrupt_ids)) if a != b]
        assert len(differing) == 1, tok.pair
        if name != "facts":  # the clean prompt holds the answer, the corrupted one the foil in its place
            assert smol_tokenizer.decode([tok.clean_ids[differing[0]]]).strip() in (tok.pair.answer.strip(),
                                                                                  tok.pair.foil.strip())


def test_greater_than_answers_above_the_start_and_foils_below():
    for pair in generate("greater-than", 60, 2):
        tens = int(pair.clean.split("year ")[1][2])  # "... the year 1752 to ..." -> 5
        assert int(pair.answer) > tens > int(pair.foil)
        assert " 01 " not in pair.clean and pair.corrupt.split("year ")[1][2:4] == "01"


def test_ioi_puts_the_names_in_both_orders():
    pairs = generate("ioi", 40, 0)
    first_is_answer = [p.clean.split()[1] == p.answer.strip() for p in pairs]
    assert any(first_is_answer) and not all(first_is_answer)


def test_a_spec_names_a_generator_count_and_seed():
    assert parse_spec("ioi:64:0") == ("ioi", 64, 0)
    assert parse_spec("greater-than:8:3") == ("greater-than", 8, 3)
    assert parse_spec("facts") == ("facts", 64, 0)
    assert parse_spec("induction:5") == ("induction", 5, 0)
    dataset = load_dataset("ioi:4:2")
    assert dataset.pairs == tuple(generate("ioi", 4, 2)) and dataset.rows == (1, 2, 3, 4)
    assert dataset.source == "ioi:4:2"


@pytest.mark.parametrize("spec, expected", [
    ("ioi:x:0", "not a whole number"), ("ioi:0:0", "at least one pair"), ("ioi:4:0:9", "not a generator spec"),
    ("wiki:4:0", "not a generator spec"),
])
def test_a_bad_spec_says_what_to_write(spec, expected):
    with pytest.raises(DatasetError, match=expected):
        parse_spec(spec)


def test_no_such_file_and_no_spec_lists_the_generators(tmp_path):
    with pytest.raises(DatasetError, match="ioi, greater-than, induction, facts"):
        load_dataset(str(tmp_path / "missing.jsonl"))


def test_a_jsonl_file_is_read_with_its_spaces(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(p.to_dict()) for p in [GOOD, GOOD]) + "\n")
    dataset = load_dataset(str(path))
    assert dataset.pairs == (GOOD, GOOD) and dataset.rows == (1, 2) and not dataset.problems
    assert dataset.pairs[0].answer == " Mary"


def test_a_csv_file_is_read_with_its_spaces(tmp_path):
    path = tmp_path / "pairs.csv"
    path.write_text(f'clean,corrupt,answer,foil,note\n"{GOOD.clean}","{GOOD.corrupt}", Mary, John,x\n')
    dataset = load_dataset(str(path))
    assert dataset.pairs == (GOOD,)


@pytest.mark.parametrize("content, name, expected", [
    (b"hello world\nthis is prose", "notes.txt", "neither JSONL"),
    (b"\xff\xfe\x00\x01", "pairs.bin", "not a text file"),
    (b"", "pairs.jsonl", "empty"),
    (b"  \n\n", "pairs.csv", "empty"),
    (b"clean,corrupt\na,b\n", "pairs.csv", "lacks answer, foil"),
    (b"this is not json\nnor this\n", "pairs.jsonl", "not JSONL"),
    (b"clean,corrupt,answer,foil\n", "pairs.csv", "holds no pairs"),
])
def test_a_file_that_cannot_be_read_says_why(content, name, expected):
    with pytest.raises(DatasetError, match=expected):
        parse_pairs(content, name)


def test_bad_rows_are_problems_naming_their_row_and_the_rest_are_kept():
    lines = [json.dumps(GOOD.to_dict()), "", "{not json", json.dumps({"clean": "a", "corrupt": "b"}), "[1, 2]",
             json.dumps({**GOOD.to_dict(), "answer": ""}), json.dumps({**GOOD.to_dict(), "foil": 3}),
             json.dumps(GOOD.to_dict())]
    dataset = parse_pairs("\n".join(lines), "pairs.jsonl")
    assert dataset.pairs == (GOOD, GOOD) and dataset.rows == (1, 7)
    messages = [str(p) for p in dataset.problems]
    assert messages[0].startswith("pair 2 (row 2, line 3): not a JSON object")
    assert messages[1].startswith("pair 3 (row 3, line 4): no answer, foil")
    assert messages[2].startswith("pair 4 (row 4, line 5): expected an object")
    assert "the answer is empty" in messages[3] and "the foil must be text, not int" in messages[4]


def test_a_csv_row_with_too_many_cells_is_a_problem():
    text = f'clean,corrupt,answer,foil\n"{GOOD.clean}","{GOOD.corrupt}", Mary, John\na,b,c,d,e,f\n'
    dataset = parse_pairs(text, "pairs.csv")
    assert dataset.pairs == (GOOD,)
    assert str(dataset.problems[0]).startswith("pair 2 (row 2, line 3): 6 cells for 4 columns")


def test_prompts_of_different_token_counts_name_the_pair_and_its_tokens(smol_tokenizer):
    bad = Pair("The cat sat", "The elephant sat down", " on", " by")
    checked = validate([GOOD, bad, GOOD], smol_tokenizer)
    assert [t.row for t in checked.pairs] == [1, 3]  # the valid pairs still run
    expected = ("pair 2 (row 2): the clean prompt is 3 tokens and the corrupted prompt 4, and they must be as many "
                "(clean: 'The' ' cat' ' sat'; corrupted: 'The' ' elephant' ' sat' ' down')")
    assert checked.messages == [expected]


def test_an_answer_or_foil_of_several_tokens_names_its_pieces(smol_tokenizer):
    checked = validate([Pair(GOOD.clean, GOOD.corrupt, " Maryanne", " John"),
                        Pair(GOOD.clean, GOOD.corrupt, " Mary", "John Smith")], smol_tokenizer)
    assert not checked.pairs
    pieces = " + ".join(repr(smol_tokenizer.decode([i])) for i in smol_tokenizer(" Maryanne",
                                                                                 add_special_tokens=False).input_ids)
    assert checked.messages[0] == f"pair 1 (row 1): the answer ' Maryanne' is 2 tokens: {pieces}; it must be one token"
    assert checked.messages[1].startswith("pair 2 (row 2): the foil 'John Smith' is 2 tokens: 'John' + ' Smith'")
    assert "usually starts with a space" in checked.messages[1]


def test_the_answer_must_not_be_the_foil(smol_tokenizer):
    checked = validate([Pair(GOOD.clean, GOOD.corrupt, " Mary", " Mary")], smol_tokenizer)
    assert "the answer and the foil are the same token" in checked.messages[0]


def test_answer_and_foil_are_tokenised_verbatim_with_their_space(smol_tokenizer):
    with_space = validate([GOOD], smol_tokenizer).pairs[0]
    without = validate([Pair(GOOD.clean, GOOD.corrupt, "Mary", "John")], smol_tokenizer).pairs[0]
    assert with_space.answer_id == smol_tokenizer(" Mary", add_special_tokens=False).input_ids[0]
    assert with_space.answer_id != without.answer_id


def test_reading_and_token_problems_come_together_in_row_order(smol_tokenizer):
    text = "\n".join([json.dumps({**GOOD.to_dict(), "answer": " Maryanne"}), "oops", json.dumps(GOOD.to_dict())])
    checked = validate(parse_pairs(text, "p.jsonl"), smol_tokenizer)
    assert [p.row for p in checked.problems] == [1, 2] and [t.row for t in checked.pairs] == [3]


def test_a_dataset_with_no_valid_pair_says_so(smol_tokenizer):
    with pytest.raises(DatasetError, match="No pair of the dataset can run .*pair 1 \\(row 1\\)"):
        validate([Pair("a b", "a b c", " x", " y")], smol_tokenizer).require()
    assert validate([GOOD], smol_tokenizer).require().pairs


def test_pairs_of_different_templates_share_no_token_count(smol_tokenizer):
    mixed = validate(generate("ioi", 2, 0) + generate("facts", 2, 0), smol_tokenizer)
    assert not mixed.problems and mixed.n_tokens is None


def test_a_pair_needs_four_texts():
    with pytest.raises(ValueError, match="the clean is empty"):
        Pair("", "b", " a", " b")
    assert Dataset.of([GOOD]).rows == (1,)
