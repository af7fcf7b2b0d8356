"""Where a corpus's texts come from: the demo corpus, an uploaded file, or a Hugging Face dataset.

Every reader returns a ``Corpus``: the texts (sentence A and an optional sentence B), a fingerprint
of exactly those texts, and notes for the user (what was capped or skipped). Bad input raises
``CorpusInputError`` with a message that says what to do.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

DEMO_PATH = Path(__file__).parent / "data" / "demo_corpus.jsonl"
DEMO_NAME = "demo"
FILE_KINDS = (".txt", ".csv", ".tsv", ".jsonl")
MAX_FILE_BYTES = 512 * 1024 * 1024


class CorpusInputError(ValueError):
    """The texts cannot be read; the message says what to change."""


@dataclass(frozen=True)
class Corpus:
    """Texts to run, in order; a text's id is its index here.

    Attributes:
        name: where the texts came from (file name, dataset id, "demo").
        texts: (sentence A, sentence B or None) per text.
        notes: what the reader capped or skipped, for the user.
        total_seen: texts the source had before the cap (a lower bound when reading stopped early).
    """

    name: str
    texts: tuple[tuple[str, str | None], ...]
    notes: tuple[str, ...] = ()
    total_seen: int = 0
    fingerprint: str = field(init=False)

    def __post_init__(self) -> None:
        if not self.texts:
            raise CorpusInputError(f"{self.name} has no texts: every line or row was empty.")
        digest = hashlib.sha256()
        for a, b in self.texts:
            digest.update(a.encode("utf-8", "surrogatepass") + b"\x1f" + (b or "").encode("utf-8", "surrogatepass")
                          + b"\x1e")
        object.__setattr__(self, "fingerprint", digest.hexdigest())

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def has_pairs(self) -> bool:
        return any(b for _, b in self.texts)


def _collect(name: str, rows: Iterable[tuple[str, str | None]], limit: int | None, notes: list[str]) -> Corpus:
    """Keep non-empty texts up to ``limit``; count what is past it without keeping it."""
    texts: list[tuple[str, str | None]] = []
    seen = empty = 0
    for a, b in rows:
        a, b = (a or "").strip(), (b or "").strip() or None
        if not a:
            empty += 1 if b is None else 0
            if b is not None:
                raise CorpusInputError(f"{name}: text {seen + 1} has a sentence B but no sentence A; "
                                       "fill in the text column or drop the row.")
            continue
        seen += 1
        if limit is None or len(texts) < limit:
            texts.append((a, b))
    if empty:
        notes.append(f"Skipped {empty} empty line(s).")
    if limit is not None and seen > limit:
        notes.append(f"Kept the first {limit:,} of {seen:,} texts (the cap is {limit:,}).")
    return Corpus(name=name, texts=tuple(texts), notes=tuple(notes), total_seen=seen)


def demo_corpus(limit: int | None = None) -> Corpus:
    """The corpus that ships with the app: about 300 texts the team wrote (see data/README.md)."""
    rows = (json.loads(line) for line in DEMO_PATH.read_text(encoding="utf-8").splitlines() if line.strip())
    return _collect(DEMO_NAME, ((r["text"], r.get("text_b")) for r in rows), limit, [])


def _decode(data: bytes, name: str) -> str:
    if not data.strip():
        raise CorpusInputError(f"{name} is empty; upload a file with one text per line (or a table with a text column).")
    if b"\x00" in data[:65536]:
        raise CorpusInputError(f"{name} looks like a binary file (it has NUL bytes); upload plain text, CSV, TSV or JSONL.")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise CorpusInputError(f"{name} is not UTF-8 text (byte 0x{data[exc.start]:02x} on line {line}); "
                               "save it as UTF-8 and upload it again.") from None


def file_kind(name: str) -> str:
    """The reader for a file name: one of ``FILE_KINDS``."""
    suffix = Path(name).suffix.lower()
    if suffix not in FILE_KINDS:
        raise CorpusInputError(f"{name!r}: use a .txt (one text per line), .csv, .tsv or .jsonl file.")
    return suffix


def table_columns(data: bytes, name: str) -> list[str]:
    """The columns a .csv/.tsv/.jsonl file offers (the header, or the first object's keys); [] for .txt."""
    kind = file_kind(name)
    if kind == ".txt":
        return []
    text = _decode(data, name)
    if kind == ".jsonl":
        first = next((line for line in text.splitlines() if line.strip()), "")
        return list(_json_object(first, 1, name).keys())
    header = next(csv.reader(io.StringIO(text), delimiter="\t" if kind == ".tsv" else ","), [])
    return [h.strip() for h in header]


def _json_object(line: str, number: int, name: str) -> dict:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise CorpusInputError(f"{name}, line {number} is not JSON ({exc.msg}); each line must be one JSON object.") from None
    if not isinstance(obj, dict):
        raise CorpusInputError(f"{name}, line {number} is not a JSON object; write one {{\"text\": ...}} per line.")
    return obj


def _pick(columns: list[str], column: str | None, name: str) -> str:
    if column is None:
        for guess in ("text", "sentence", "sentence1", "text_a"):
            if guess in columns:
                return guess
        if not columns:
            raise CorpusInputError(f"{name} has no columns; give it a header row.")
        return columns[0]
    if column not in columns:
        raise CorpusInputError(f"{name} has no column {column!r}; its columns are: {', '.join(columns) or 'none'}.")
    return column


def _cell(value: object) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else str(value)


def read_upload(data: bytes, name: str, *, column: str | None = None, pair_column: str | None = None,
                limit: int | None = None) -> Corpus:
    """Read an uploaded file's texts.

    Args:
        data: the file's bytes.
        name: its name; the suffix picks the reader (.txt one text per line, .csv, .tsv, .jsonl).
        column: the text column of a table (default: "text", "sentence", … or the first column).
        pair_column: an optional column with sentence B.
        limit: keep at most this many texts (the rest are counted, not kept).

    Raises:
        CorpusInputError: empty, binary, not UTF-8, malformed, or a column that does not exist.
    """
    kind = file_kind(name)
    if len(data) > MAX_FILE_BYTES:
        raise CorpusInputError(f"{name} is {len(data) / 2**20:.0f} MB; the limit is {MAX_FILE_BYTES // 2**20} MB.")
    text = _decode(data, name)
    notes: list[str] = []
    if kind == ".txt":
        if pair_column:
            raise CorpusInputError("A .txt file has one text per line and no columns; use CSV, TSV or JSONL for pairs.")
        return _collect(name, ((line, None) for line in text.splitlines()), limit, notes)
    if kind == ".jsonl":
        lines = [(i, line) for i, line in enumerate(text.splitlines(), 1) if line.strip()]
        columns = list(_json_object(lines[0][1], lines[0][0], name).keys()) if lines else []
        col = _pick(columns, column, name)
        if pair_column is not None:
            _pick(columns, pair_column, name)

        def jsonl_rows() -> Iterator[tuple[str, str | None]]:
            for number, line in lines:
                obj = _json_object(line, number, name)
                if col not in obj:
                    raise CorpusInputError(f"{name}, line {number} has no {col!r} key.")
                yield _cell(obj[col]) or "", _cell(obj.get(pair_column)) if pair_column else None

        return _collect(name, jsonl_rows(), limit, notes)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t" if kind == ".tsv" else ",")
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise CorpusInputError(f"{name} is empty.") from None
    except csv.Error as exc:
        raise CorpusInputError(f"{name} is not a valid table ({exc}).") from None
    col = header.index(_pick(header, column, name))
    pair = header.index(_pick(header, pair_column, name)) if pair_column else None

    def table_rows() -> Iterator[tuple[str, str | None]]:
        try:
            for row in reader:
                if not any(cell.strip() for cell in row):
                    continue
                yield (row[col] if col < len(row) else ""), (row[pair] if pair is not None and pair < len(row) else None)
        except csv.Error as exc:
            raise CorpusInputError(f"{name}, line {reader.line_num}: {exc}; check the quoting.") from None

    return _collect(name, table_rows(), limit, notes)


def read_path(path: str | Path, **kwargs) -> Corpus:
    """``read_upload`` for a file on disk, or the demo corpus for the name ``demo``."""
    if str(path) == DEMO_NAME:
        return demo_corpus(kwargs.get("limit"))
    p = Path(path)
    if not p.is_file():
        raise CorpusInputError(f"{str(path)!r} is not a file; give a .txt, .csv, .tsv or .jsonl file, or 'demo'.")
    return read_upload(p.read_bytes(), p.name, **kwargs)


def read_hub_dataset(dataset_id: str, *, split: str = "train", column: str | None = None,
                     pair_column: str | None = None, limit: int | None = 1000, config: str | None = None) -> Corpus:
    """Texts from a ``datasets`` id (the hub, when reachable) or a local dataset folder.

    Raises:
        CorpusInputError: ``datasets`` is missing, the hub cannot be reached, or the split or
            column does not exist.
    """
    dataset_id = (dataset_id or "").strip()
    if not dataset_id:
        raise CorpusInputError("Type a dataset id, such as imdb or glue, or a local dataset folder.")
    try:
        import datasets
    except ImportError:
        raise CorpusInputError("Reading hub datasets needs the `datasets` package: pip install datasets.") from None
    from model_core.loading import _hub_reachable

    local = Path(dataset_id).expanduser().exists()
    if not local and not _hub_reachable():
        raise CorpusInputError(f"The Hugging Face hub cannot be reached from this server, so dataset {dataset_id!r} "
                               "cannot be downloaded; upload a file or use the demo corpus.")
    try:
        ds = datasets.load_dataset(dataset_id, config, split=split, streaming=not local)
    except (ValueError, FileNotFoundError, ConnectionError, OSError) as exc:
        raise CorpusInputError(f"Could not load dataset {dataset_id!r}, split {split!r}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - datasets raises many kinds; the user needs one message
        raise CorpusInputError(f"Could not load dataset {dataset_id!r} ({type(exc).__name__}: {exc}).") from None
    columns = list(ds.column_names or [])
    col = _pick(columns, column, dataset_id)
    if pair_column:
        _pick(columns, pair_column, dataset_id)

    def rows() -> Iterator[tuple[str, str | None]]:
        for i, row in enumerate(ds):
            if limit is not None and i >= limit + 1:  # one past the cap: enough to say there were more
                return
            yield _cell(row[col]) or "", _cell(row.get(pair_column)) if pair_column else None

    corpus = _collect(f"{dataset_id}:{split}", rows(), limit, [])
    if limit is not None and corpus.total_seen > limit:
        notes = tuple(n for n in corpus.notes if not n.startswith("Kept the first"))
        return Corpus(corpus.name, corpus.texts, (*notes, f"Kept the first {limit:,} rows (the cap is {limit:,})."),
                      corpus.total_seen)
    return corpus
