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


_COLUMN_GUESSES = ("text", "sentence", "sentence1", "text_a")  # the text column when none is named


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


# Byte-order marks, longest first (UTF-32 LE's starts with UTF-16 LE's): Windows Notepad saves "Unicode" as
# UTF-16 LE with a mark, and "UTF-8 with BOM" with the UTF-8 one.
_BOMS = ((b"\xff\xfe\x00\x00", "utf-32"), (b"\x00\x00\xfe\xff", "utf-32"), (b"\xff\xfe", "utf-16"),
         (b"\xfe\xff", "utf-16"), (b"\xef\xbb\xbf", "utf-8-sig"))


def _decode(data: bytes, name: str) -> str:
    """The file's text: UTF-8, or UTF-8/16/32 with a byte-order mark."""
    encoding = next((enc for bom, enc in _BOMS if data.startswith(bom)), None)
    if encoding not in (None, "utf-8-sig"):
        try:
            text = data.decode(encoding)  # the codec reads the mark and drops it
        except UnicodeDecodeError as exc:
            raise CorpusInputError(f"{name} starts with a {encoding.upper()} byte-order mark but is not valid "
                                   f"{encoding.upper()} (at byte {exc.start}); save it as UTF-8 and upload it again.") from None
    else:
        if b"\x00" in data[:65536]:
            raise CorpusInputError(f"{name} looks like a binary file (it has NUL bytes); upload plain text, CSV, TSV or "
                                   "JSONL. If it is UTF-16 text without a byte-order mark, save it as UTF-8.")
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            line = data[: exc.start].count(b"\n") + 1
            raise CorpusInputError(f"{name} is not UTF-8 text (byte 0x{data[exc.start]:02x} on line {line}); "
                                   "save it as UTF-8 and upload it again.") from None
    if not text.strip():
        raise CorpusInputError(f"{name} is empty; upload a file with one text per line (or a table with a text column).")
    return text


def decode_text(data: bytes, name: str) -> str:
    """An uploaded text file's text (UTF-8, or UTF-8/16/32 with a byte-order mark); ``CorpusInputError`` says why
    not (binary, another encoding, empty)."""
    return _decode(data, name)


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
        for guess in _COLUMN_GUESSES:
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
    return _read_table(text, name, kind, column, pair_column, limit)


def _read_table(text: str, name: str, kind: str, column: str | None, pair_column: str | None,
                limit: int | None) -> Corpus:
    """A .csv or .tsv: a header row, then one text per row."""
    delimiter, what = ("\t", "tab") if kind == ".tsv" else (",", "comma")
    lines = io.StringIO(text, newline="").readlines()
    reader = csv.reader(lines, delimiter=delimiter)
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise CorpusInputError(f"{name} is empty.") from None
    except csv.Error as exc:
        raise CorpusInputError(f"{name} is not a valid table ({exc}).") from None
    col = header.index(_pick(header, column, name))
    pair = header.index(_pick(header, pair_column, name)) if pair_column else None
    notes: list[str] = []
    one_column = delimiter not in text
    if one_column and column is None and header[0] not in _COLUMN_GUESSES:
        notes.append(f"{name} has no {what}: read as one column, its first line ({header[0][:60]!r}) taken as the "
                     "header row, not as a text.")
    rows = 0

    def table_rows() -> Iterator[tuple[str, str | None]]:
        nonlocal rows
        start = end = reader.line_num  # the lines before the last row read, and through it
        try:
            for row in reader:
                start, end = end, reader.line_num
                if any(cell.strip() for cell in row):
                    rows += 1
                    yield (row[col] if col < len(row) else ""), (row[pair] if pair is not None and pair < len(row) else None)
        except csv.Error as exc:
            raise CorpusInputError(f"{name}, line {reader.line_num}: {exc}; check the quoting.") from None
        _check_quotes_closed("".join(lines[start:]), start + 1, len(lines), name, delimiter)

    try:
        return _collect(name, table_rows(), limit, notes)
    except CorpusInputError as exc:
        if rows:
            raise
        hint = (f" It has no {what}, so it is one column." if one_column else "")
        raise CorpusInputError(
            f"{name} has no texts: its only non-empty line, {header[0][:60]!r}, is the header row a {kind} file starts "
            f"with (the column names), and no row follows it.{hint} Put a header line such as 'text' above the texts, "
            "or upload them as a .txt file (one text per line).") from exc


def _check_quotes_closed(last_row: str, first_line: int, n_lines: int, name: str, delimiter: str) -> None:
    """Refuse a table whose last row opens a quote it never closes: the lenient reader would have made the
    rest of the file one text."""
    try:
        list(csv.reader(io.StringIO(last_row, newline=""), delimiter=delimiter, strict=True))
    except csv.Error as exc:
        if "unexpected end of data" not in str(exc):
            return  # other quoting quirks the lenient reader accepts stay accepted
        raise CorpusInputError(
            f"{name}, line {first_line}: a quote (\") opens a field that is never closed, so lines {first_line}-"
            f"{n_lines} would all be one text. Close the quote, or write a quote inside a text as two (\"\")."
        ) from None


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
        import datasets  # Hugging Face datasets: seconds to import, needed by hub dataset ids alone
    except ImportError:
        raise CorpusInputError("Reading hub datasets needs the `datasets` package: pip install datasets.") from None
    from model_core.models.loading import _hub_reachable  # loading brings torch: reading a local corpus does not

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
