"""Datasets of prompt pairs: the team's generators by spec (``ioi:64:0``), the user's JSONL or CSV, and the check of
every pair against a model's tokenizer. A pair that cannot run gets a ``Problem`` naming its row and its pieces; the
valid pairs run, and nothing is dropped silently.

    dataset = load_dataset("ioi:64:0")                 # or a path: pairs.jsonl, pairs.csv
    checked = validate(dataset, tokenizer)
    checked.pairs, [str(p) for p in checked.problems]
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from model_core.circuits.generators import GENERATORS, generate
from model_core.circuits.pair import FIELDS, Pair, Problem

__all__ = ["Dataset", "DatasetError", "Pair", "Problem", "TokenizedPair", "Validated", "generate", "load_dataset",
           "parse_pairs", "parse_spec", "read_pairs", "validate"]

DEFAULT_COUNT, DEFAULT_SEED = 64, 0
"""A spec's count and seed when it leaves them out (``ioi`` is ``ioi:64:0``)."""
JSONL_SUFFIXES, CSV_SUFFIXES = (".jsonl", ".ndjson", ".json"), (".csv",)


class DatasetError(ValueError):
    """A dataset that cannot be used at all (no such file, not JSONL or CSV, no pairs); the message says what to do."""


@dataclass(frozen=True)
class Dataset:
    """Pairs read from a file or made by a generator, with the rows that could not be read.

    Attributes:
        pairs: the pairs read. rows: each pair's 1-based row in the source.
        problems: the rows that could not be read (bad JSON, a missing field), with why.
        source: the file's name or the generator's spec.
    """

    pairs: tuple[Pair, ...]
    rows: tuple[int, ...]
    problems: tuple[Problem, ...] = ()
    source: str = ""
    lines: tuple[int | None, ...] = field(default=(), repr=False)
    """Each pair's line in its file, where that is another number than its row (else empty)."""

    def __post_init__(self) -> None:
        if len(self.rows) != len(self.pairs):
            raise ValueError(f"{len(self.pairs)} pairs but {len(self.rows)} rows")

    @classmethod
    def of(cls, pairs: Iterable[Pair], source: str = "") -> Dataset:
        """Pairs numbered 1, 2, ... in order."""
        pairs = tuple(pairs)
        return cls(pairs, tuple(range(1, len(pairs) + 1)), (), source)

    def line_of(self, index: int) -> int | None:
        return self.lines[index] if self.lines else None


# -- generator specs --------------------------------------------------------------------------------------------------
def parse_spec(spec: str) -> tuple[str, int, int]:
    """``name[:count[:seed]]`` as (name, count, seed): ``ioi:64:0`` is 64 IOI pairs with seed 0.

    Raises:
        DatasetError: an unknown generator, or a count or seed that is not a whole number.
    """
    parts = spec.strip().split(":")
    name = parts[0].strip().lower()
    if name not in GENERATORS or len(parts) > 3:
        raise DatasetError(f"{spec!r} is not a generator spec: write name:count:seed (e.g. ioi:64:0), name one of "
                           f"{', '.join(GENERATORS)}.")
    numbers = []
    for part, default, what in zip(parts[1:] + [None, None], (DEFAULT_COUNT, DEFAULT_SEED), ("count", "seed")):
        if part is None or not part.strip():
            numbers.append(default)
            continue
        try:
            numbers.append(int(part))
        except ValueError:
            raise DatasetError(f"The {what} in {spec!r} is {part!r}, not a whole number (e.g. ioi:64:0).") from None
    count, seed = numbers
    if count < 1:
        raise DatasetError(f"The count in {spec!r} is {count}: ask for at least one pair (e.g. ioi:64:0).")
    return name, count, seed


def is_spec(source: str) -> bool:
    """Whether ``source`` names a generator (``ioi``, ``ioi:64:0``) rather than a file."""
    return source.strip().split(":")[0].lower() in GENERATORS


def from_generator(spec: str) -> Dataset:
    """The pairs a generator spec makes (``parse_spec``).

    Raises:
        DatasetError: a bad spec or count.
    """
    name, count, seed = parse_spec(spec)
    try:
        return Dataset.of(generate(name, count, seed), f"{name}:{count}:{seed}")
    except ValueError as exc:
        raise DatasetError(str(exc)) from None


# -- files -----------------------------------------------------------------------------------------------------------
def load_dataset(source: str | Path) -> Dataset:
    """A file (JSONL or CSV with clean, corrupt, answer, foil) or, when no such file exists, a generator spec.

    Raises:
        DatasetError: no such file and not a spec; a file that is not JSONL or CSV; a dataset with no pairs.
    """
    path = Path(source)
    if path.is_file():
        return read_pairs(path)
    if isinstance(source, str) and is_spec(source):
        return from_generator(source)
    raise DatasetError(f"No file {str(source)!r}, and it is not a generator spec. Give a JSONL or CSV file of pairs "
                       f"(clean, corrupt, answer, foil) or a generator as name:count:seed, e.g. ioi:64:0 (generators: "
                       f"{', '.join(GENERATORS)}).")


def read_pairs(path: str | Path) -> Dataset:
    """The pairs of a JSONL or CSV file (``parse_pairs``).

    Raises:
        DatasetError: unreadable, not text, not JSONL or CSV, or no pairs.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DatasetError(f"Cannot read {str(path)!r}: {exc.strerror or exc}.") from None
    return parse_pairs(data, path.name)


def parse_pairs(data: bytes | str, name: str = "the file") -> Dataset:
    """The pairs of a file's contents: JSONL (one object a line) when its name ends in .jsonl/.ndjson/.json or its
    first character is ``{``, CSV (a header naming clean, corrupt, answer, foil) when its name ends in .csv or its
    first line names those columns. A row that cannot be read becomes a ``Problem``; the others are kept.

    Raises:
        DatasetError: not UTF-8 text, neither JSONL nor CSV, a CSV without the four columns, or no pairs at all.
    """
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise DatasetError(f"{name} is not a text file (not UTF-8), so not JSONL or CSV. Give one JSON object a "
                               "line, or a CSV with a header: clean,corrupt,answer,foil.") from None
    data = data.lstrip("\ufeff")
    stripped = data.lstrip()
    if not stripped:
        raise DatasetError(f"{name} is empty: it holds no pairs. Give at least one row with clean, corrupt, answer "
                           "and foil.")
    suffix = Path(name).suffix.lower()
    first_line = stripped.splitlines()[0]
    if suffix in JSONL_SUFFIXES or (suffix not in CSV_SUFFIXES and stripped[0] in "{["):
        dataset = _parse_jsonl(data, name)
    elif suffix in CSV_SUFFIXES or _csv_header(first_line):
        dataset = _parse_csv(data, name)
    else:
        raise DatasetError(f"{name} is neither JSONL (one JSON object a line) nor CSV (a header line naming clean, "
                           f"corrupt, answer, foil): its first line is {first_line[:80]!r}.")
    if not dataset.pairs and not dataset.problems:
        raise DatasetError(f"{name} holds no pairs. Give at least one row with clean, corrupt, answer and foil.")
    return dataset


def _csv_header(line: str) -> bool:
    names = {cell.strip().lower() for cell in next(csv.reader([line]), [])}
    return set(FIELDS) <= names


def _record(value: Any, row: int, line: int | None) -> Pair | Problem:
    """One record (a dict) as a Pair, or the Problem that says why it is not one."""
    if not isinstance(value, dict):
        return Problem(row, f"expected an object with clean, corrupt, answer and foil, got {type(value).__name__} "
                            f"{str(value)[:60]!r}", line)
    missing = [name for name in FIELDS if value.get(name) is None]
    if missing:
        found = ", ".join(str(k) for k, v in value.items() if v is not None) or "nothing"
        return Problem(row, f"no {', '.join(missing)} (the row has {found}); every row needs clean, corrupt, answer "
                            "and foil", line)
    try:
        return Pair(*(value[name] for name in FIELDS))
    except ValueError as exc:
        return Problem(row, f"{exc}; every row needs clean, corrupt, answer and foil as text", line)


def _collect(records: Iterable[tuple[int, int | None, Any]], name: str) -> Dataset:
    pairs, rows, lines, problems = [], [], [], []
    for row, line, value in records:
        got = value if isinstance(value, Problem) else _record(value, row, line)
        if isinstance(got, Problem):
            problems.append(got)
        else:
            pairs.append(got)
            rows.append(row)
            lines.append(line)
    return Dataset(tuple(pairs), tuple(rows), tuple(problems), name,
                   tuple(lines) if any(l not in (None, r) for l, r in zip(lines, rows)) else ())


def _parse_jsonl(text: str, name: str) -> Dataset:
    stripped = text.strip()
    if stripped.startswith("["):  # a JSON array of objects is accepted too
        try:
            values = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{name} starts like a JSON array but is not valid JSON ({exc.msg} at line "
                               f"{exc.lineno}). Write one JSON object a line (JSONL).") from None
        if not isinstance(values, list):
            raise DatasetError(f"{name} is JSON but not a list of pairs.")
        return _collect(((i, None, v) for i, v in enumerate(values, start=1)), name)
    records, parsed = [], 0
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        row = len(records) + 1
        try:
            value = json.loads(line)
            parsed += 1
        except json.JSONDecodeError as exc:
            value = Problem(row, f"not a JSON object ({exc.msg}): {line.strip()[:60]!r}", line_no)
        records.append((row, line_no, value))
    if records and not parsed:
        raise DatasetError(f"{name} is not JSONL: none of its lines is JSON (the first is "
                           f"{next(l for l in text.splitlines() if l.strip())[:60]!r}). Write one object a line: "
                           '{"clean": "...", "corrupt": "...", "answer": " X", "foil": " Y"}, or give a CSV.')
    return _collect(records, name)


def _parse_csv(text: str, name: str) -> Dataset:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = [h.strip().lower() for h in (reader.fieldnames or [])]
    missing = [f for f in FIELDS if f not in header]
    if missing:
        raise DatasetError(f"{name} is not a CSV of pairs: its header {', '.join(reader.fieldnames or []) or '(none)'}"
                           f" lacks {', '.join(missing)}. The first line must name the columns clean, corrupt, "
                           "answer, foil.")
    reader.fieldnames = header  # the cells keep their spaces: " Mary" is the answer as written
    records = []
    for row, record in enumerate(reader, start=1):
        line = reader.line_num
        if None in record:  # more cells than the header names
            records.append((row, line, Problem(row, f"{len(header) + len(record[None])} cells for {len(header)} "
                                                    "columns; quote a cell that holds a comma", line)))
            continue
        records.append((row, line, {k: record.get(k) for k in FIELDS}))
    return _collect(records, name)


# -- the check against a tokenizer -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class TokenizedPair:
    """A pair that passed the check, as the model reads it.

    Attributes:
        pair: the texts. row: its 1-based row in the dataset.
        clean_ids, corrupt_ids: ``tokenizer(text).input_ids`` (no chat template), as many of each.
        answer_id, foil_id: the answer's and the foil's one token each.
    """

    pair: Pair
    row: int
    clean_ids: tuple[int, ...]
    corrupt_ids: tuple[int, ...]
    answer_id: int
    foil_id: int

    @property
    def n_tokens(self) -> int:
        return len(self.clean_ids)


@dataclass(frozen=True)
class Validated:
    """A dataset checked against a tokenizer: the pairs that run, and a problem for every pair that does not
    (reading problems first in row order with the rest)."""

    pairs: tuple[TokenizedPair, ...]
    problems: tuple[Problem, ...]

    @property
    def messages(self) -> list[str]:
        """Each problem as one line: "pair 3 (row 3): ..."."""
        return [str(p) for p in self.problems]

    @property
    def n_tokens(self) -> int | None:
        """The token count every valid pair shares (one template), or None when they differ or there are none."""
        counts = {p.n_tokens for p in self.pairs}
        return counts.pop() if len(counts) == 1 else None

    def require(self) -> Validated:
        """Itself, when at least one pair can run.

        Raises:
            DatasetError: no pair is valid; the message lists the first problems.
        """
        if self.pairs:
            return self
        shown = "; ".join(self.messages[:5]) + ("; …" if len(self.problems) > 5 else "")
        raise DatasetError(f"No pair of the dataset can run ({len(self.problems)} with problems): {shown}" if
                           self.problems else "The dataset holds no pairs.")


def _ids(encoded: Any) -> list[int]:
    ids = encoded["input_ids"]
    return [int(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]


def _pieces(tokenizer: Any, ids: Sequence[int]) -> str:
    return " ".join(repr(tokenizer.decode([i])) for i in ids) or "nothing"


def _one_token(tokenizer: Any, text: str, role: str) -> tuple[int | None, str | None]:
    """(its id, None), or (None, why it is not one token, with its pieces)."""
    ids = _ids(tokenizer(text, add_special_tokens=False))
    if len(ids) == 1:
        return ids[0], None
    pieces = " + ".join(repr(tokenizer.decode([i])) for i in ids) or "nothing"
    hint = "" if text.startswith(" ") or text[:1].isdigit() else " (a word in running text usually starts with a space)"
    return None, f"the {role} {text!r} is {len(ids)} tokens: {pieces}; it must be one token{hint}"


def check_pair(pair: Pair, row: int, tokenizer: Any, line: int | None = None) -> TokenizedPair | Problem:
    """One pair against a tokenizer: the prompts as ``tokenizer(text).input_ids``, as many tokens each; the answer
    and foil verbatim without special tokens, one token each and not the same token."""
    clean, corrupt = _ids(tokenizer(pair.clean)), _ids(tokenizer(pair.corrupt))
    reasons = []
    if len(clean) != len(corrupt):
        reasons.append(f"the clean prompt is {len(clean)} tokens and the corrupted prompt {len(corrupt)}, and they "
                       f"must be as many (clean: {_pieces(tokenizer, clean)}; corrupted: "
                       f"{_pieces(tokenizer, corrupt)})")
    answer, why_answer = _one_token(tokenizer, pair.answer, "answer")
    foil, why_foil = _one_token(tokenizer, pair.foil, "foil")
    reasons += [why for why in (why_answer, why_foil) if why]
    if answer is not None and answer == foil:
        reasons.append(f"the answer and the foil are the same token ({pair.answer!r}), so the metric is always 0")
    if reasons:
        return Problem(row, "; ".join(reasons), line)
    return TokenizedPair(pair, row, tuple(clean), tuple(corrupt), int(answer), int(foil))


def validate(dataset: Dataset | Sequence[Pair], tokenizer: Any) -> Validated:
    """Check every pair against ``tokenizer`` (``check_pair``): the valid pairs, and every problem (the dataset's
    reading problems too), in row order. Nothing is dropped without a problem saying why."""
    if not isinstance(dataset, Dataset):
        dataset = Dataset.of(dataset)
    pairs, problems = [], list(dataset.problems)
    for i, (pair, row) in enumerate(zip(dataset.pairs, dataset.rows)):
        got = check_pair(pair, row, tokenizer, dataset.line_of(i))
        (problems if isinstance(got, Problem) else pairs).append(got)
    return Validated(tuple(pairs), tuple(sorted(problems, key=lambda p: p.row)))
