"""``run_corpus``: stream a corpus through a model shard by shard into a run folder, locally or on Ray."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from model_core.analysis.per_head import STAT_NAMES
from model_core.corpus.batches import ChunkResult, LongPolicy, encode_texts, largest_batch, process_chunk
from model_core.corpus.model import CorpusModel, LoadedCorpusModel
from model_core.families import Family
from model_core.corpus.sample import array_path, create_arrays, plan_sample, write_rows
from model_core.corpus.sources import Corpus
from model_core.corpus.stats import PatternRules, StatSums
from model_core.models.run_memory import (
    check_run_memory,
    device_of,
    model_shape,
    run_memory_limit_mb,
    trace_pass_bytes,
)
import model_core.corpus.store as store
from model_core.corpus.index import build_indexes
from model_core.corpus.ray_engine import describe_remote, run_shards_on_ray
from model_core.models.memory import release_freed_memory

CORPUS_MAX_TOKENS = 512
"""The longest corpus text: a batch holds every layer x head x n² weights of its texts at once."""

Engine = Literal["local", "ray"]


@dataclass(frozen=True)
class RunOptions:
    """How a corpus is run. Recorded in the manifest; a resume keeps the original's."""

    batch_size: int = 64
    chunk_size: int = 512
    max_tokens: int = CORPUS_MAX_TOKENS
    long: LongPolicy = "truncate"
    sample_cap: int = 0  # tokens in the token sample; 0 keeps none
    keep_qk: bool = False  # keep the sample's queries and keys (the query-key space)
    index: bool = False  # keep the sample's hidden states and build a nearest-context index per layer
    sample_seed: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.batch_size <= 4096:
            raise ValueError(f"--batch-size must be between 1 and 4096, got {self.batch_size}.")
        if not 1 <= self.chunk_size <= 1_000_000:
            raise ValueError(f"The shard size must be between 1 and 1,000,000, got {self.chunk_size}.")
        if not 3 <= self.max_tokens <= CORPUS_MAX_TOKENS:
            raise ValueError(f"--max-tokens must be between 3 and {CORPUS_MAX_TOKENS}, got {self.max_tokens}.")
        if self.long not in ("truncate", "skip"):
            raise ValueError(f"--long must be 'truncate' or 'skip', got {self.long!r}.")
        if self.sample_cap < 0 or ((self.keep_qk or self.index) and self.sample_cap == 0):
            raise ValueError("--qk and --index need a token sample: give --sample-cap a positive number of tokens.")

    @property
    def sampling(self) -> bool:
        return self.sample_cap > 0 and (self.keep_qk or self.index)


@dataclass(frozen=True)
class Progress:
    """Where a run stands, for a progress bar."""

    done: int
    total: int
    elapsed_s: float
    new_texts: int  # texts run in this session (a resume starts above 0 done)

    @property
    def rate(self) -> float:
        """Texts per second in this session."""
        return self.new_texts / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        return (self.total - self.done) / self.rate if self.rate > 0 else None


def _shards(corpus: Corpus, chunk_size: int) -> list[tuple[int, int, list[tuple[str, str | None]]]]:
    return [(i, start, list(corpus.texts[start:start + chunk_size]))
            for i, start in enumerate(range(0, len(corpus), chunk_size))]


def _plan_sample(out: Path, corpus: Corpus, tokenizer, options: RunOptions, limit: int, n_layers: int,
                 hidden_size: int, family: Family):
    """Plan the token sample from every text's tokens (tokenising is cheap; the model has not run yet) and
    allocate its arrays; a resume plans the same sample and keeps the rows already written."""
    # pyarrow costs ~0.3 s to import: only a run that keeps a token sample pays it
    import pyarrow as pa
    import pyarrow.parquet as pq

    token_ids: dict[int, list[int]] = {}
    for _, first, texts in _shards(corpus, options.chunk_size):
        encoded, _ = encode_texts(tokenizer, texts, first, limit, options.long, family)
        token_ids.update({t.text_id: t.ids for t in encoded})
    plan = plan_sample(token_ids, options.sample_cap, options.sample_seed)
    kinds = {}
    if options.keep_qk:
        kinds |= {"queries": (n_layers, len(plan), hidden_size), "keys": (n_layers, len(plan), hidden_size)}
    if options.index:
        kinds["hidden"] = (n_layers + 1, len(plan), hidden_size)
    create_arrays(out, kinds)
    tokens = tokenizer.convert_ids_to_tokens(plan.token_id.tolist())
    table = pa.table({"row": pa.array(range(len(plan)), pa.int64()), "text_id": plan.text_id,
                      "position": plan.position, "token": pa.array(tokens, pa.string())})
    pq.write_table(table, array_path(out, "tokens").with_suffix(".parquet"))
    return plan


def _prepare_folder(out: Path, corpus: Corpus, model: CorpusModel, options: RunOptions, resume: bool) -> RunOptions:
    """Check ``out`` for a new run or a resume; return the options to run with (a resume keeps the original's)."""
    if (out / store.MANIFEST).exists():
        manifest = store.read_manifest(out)
        if not resume:
            raise store.CorpusRunError(f"{str(out)!r} already holds a corpus run. Pass --resume to continue it, "
                                       "or choose another --out folder.")
        if CorpusModel.from_key(manifest["model"]).key() != model.key():
            theirs = CorpusModel.from_key(manifest["model"]).label()
            raise store.CorpusRunError(f"{str(out)!r} was run with {theirs}, not {model.label()}; resume it with "
                                       "the same model, or choose another --out folder.")
        if manifest["corpus"]["fingerprint"] != corpus.fingerprint:
            raise store.CorpusRunError(f"{str(out)!r} was run on other texts (corpus hash differs); resume it with the "
                                       "same input and --limit, or choose another --out folder.")
        return RunOptions(**manifest["options"])
    if out.exists() and any(out.iterdir()):
        raise store.CorpusRunError(f"{str(out)!r} is not empty and is not a corpus run; choose a new --out folder.")
    out.mkdir(parents=True, exist_ok=True)
    return options


def check_batch_memory(model: object, batch_size: int, tokens: int) -> None:
    """Refuse a run whose largest batch (the cell budget's: ``batch_size`` texts at most, of ``tokens`` tokens) would
    pass ``AE_RUN_MEMORY_MB``.

    Raises:
        RunMemoryError (a ValueError): the estimate and the limit.
    """
    shape = model_shape(model)
    batch = largest_batch(batch_size, tokens, shape.n_layers * shape.n_heads)
    check_run_memory(f"A corpus batch of {batch} texts of {tokens:,} tokens", trace_pass_bytes(shape, batch, tokens),
                     run_memory_limit_mb(device=device_of(model)), "Lower --max-tokens or --batch-size.")


def run_corpus(
    corpus: Corpus,
    model: CorpusModel,
    out: str | Path,
    *,
    options: RunOptions = RunOptions(),
    loaded: LoadedCorpusModel | None = None,
    engine: Engine = "local",
    ray_address: str | None = None,
    ray_num_cpus: int | None = None,
    resume: bool = False,
    device: str | None = None,
    rules: PatternRules = PatternRules(),
    progress: Callable[[Progress], None] | None = None,
) -> store.CorpusRun:
    """Run every text of ``corpus`` through ``model`` and write a run folder at ``out``.

    Texts go in shards of ``options.chunk_size``; each shard is tokenised, sorted by length, packed into
    padded batches on the model's device, and its per-text statistics are written as one parquet part.
    The corpus sums are updated after every shard, so the folder is a valid (partial) run at any time:
    an interruption (Ctrl-C, a cancelled page, an exception) keeps every finished shard, and
    ``resume=True`` runs only the shards that are missing.

    Args:
        loaded: an already loaded copy of ``model`` (the app's cached one); loaded here if None.
        engine: "local" (this process) or "ray" (one task per shard on a Ray instance or cluster).
        progress: called after every shard; raising from it stops the run cleanly.

    Raises:
        CorpusRunError: ``out`` holds another run, or a resume does not match it.
        ModelLoadError, ValueError: the model or an option cannot be used.
    """
    out = Path(out).expanduser()
    options = _prepare_folder(out, corpus, model, options, resume)
    local = loaded if engine == "local" and loaded is not None else None
    if engine == "local" and local is None:
        local = model.load(device)
    elif engine not in ("local", "ray"):
        raise ValueError(f"--engine must be 'local' or 'ray', got {engine!r}.")
    if local is not None:
        check_batch_memory(local.module, options.batch_size, min(options.max_tokens, local.max_positions))
        n_layers, n_heads, description, dev = local.n_layers, local.n_heads, local.description, str(local.device)
        max_positions, tokenizer, hidden_size = local.max_positions, local.tokenizer, local.hidden_size
    else:
        n_layers, n_heads, description, dev, max_positions, hidden_size = describe_remote(model, ray_address,
                                                                                          ray_num_cpus)
        tokenizer = model.tokenizer() if options.sampling else None
    plan = _plan_sample(out, corpus, tokenizer, options, min(options.max_tokens, max_positions), n_layers,
                        hidden_size, local.family if local is not None else model.family()) \
        if options.sampling else None
    done = set(store.done_parts(out))
    sums, tally = store.tally_parts(out, n_layers, n_heads)
    counts = {"texts": len(corpus), **tally}
    previous = store.read_manifest(out) if resume and (out / store.MANIFEST).exists() else {}
    seconds_before = float(previous.get("timings", {}).get("seconds", 0.0))
    manifest = {
        "format": store.FORMAT, "format_version": store.FORMAT_VERSION, "complete": False,
        "model": model.key(), "model_description": description, "n_layers": n_layers, "n_heads": n_heads,
        "corpus": {"name": corpus.name, "fingerprint": corpus.fingerprint, "n_texts": len(corpus),
                   "has_pairs": corpus.has_pairs, "notes": list(corpus.notes)},
        "options": asdict(options), "engine": engine, "device": dev, "statistics": list(STAT_NAMES),
        "pattern_rules": asdict(rules), "versions": store.package_versions(), "counts": counts,
        "sample": None if plan is None else {"tokens": len(plan), "cap": options.sample_cap, "seed": options.sample_seed,
                                             "queries_keys": options.keep_qk, "hidden": options.index, "index": None},
        "timings": {"seconds": seconds_before},
        "created": previous.get("created", time.strftime("%Y-%m-%dT%H:%M:%S%z")),
    }
    store.write_manifest(out, manifest)
    shards = [s for s in _shards(corpus, options.chunk_size) if s[0] not in done]
    texts_of = {index: texts for index, _, texts in shards}
    start = time.perf_counter()
    new_texts = 0
    saved: set[int] = set()  # shards whose part this run wrote and whose sums it added

    def save(result: ChunkResult) -> None:
        nonlocal new_texts, sums
        if result.sample_rows is not None:  # before the part: a part on disk means its rows are written
            for kind in ("queries", "keys", "hidden"):
                values = getattr(result, kind)
                if values is not None:
                    write_rows(out, kind, result.sample_rows, values)
        store.write_part(out, result, texts_of[result.index])
        kept = ~result.skipped
        part = StatSums.zeros(n_layers, n_heads)
        part.add(result.stats[kept])
        sums = sums.merge(part)
        counts["done"] += len(result.text_ids)
        counts["truncated"] += int(result.truncated.sum())
        counts["skipped"] += int(result.skipped.sum())
        counts["tokens"] += int(result.n_tokens[kept].sum())
        new_texts += len(result.text_ids)
        release_freed_memory()  # padded batches of many shapes fragment the heap; keep the peak flat
        store.write_head_stats(out, sums, rules)
        elapsed = time.perf_counter() - start
        manifest["counts"] = counts
        manifest["timings"] = {"seconds": round(seconds_before + elapsed, 3),
                               "texts_per_s": round(new_texts / elapsed, 2) if elapsed > 0 else None,
                               "tokens_per_s": None}
        store.write_manifest(out, manifest)
        saved.add(result.index)
        if progress is not None:
            progress(Progress(counts["done"], len(corpus), elapsed, new_texts))

    results: Iterator[ChunkResult]
    def within_shard(n: int) -> None:
        if progress is not None:
            progress(Progress(counts["done"] + n, len(corpus), time.perf_counter() - start, new_texts + n))

    sample_for = (lambda first, end: plan.rows_for(first, end)) if plan is not None else None
    if engine == "local":
        assert local is not None
        results = (process_chunk(local, index, first, texts, batch_size=options.batch_size,
                                 max_tokens=options.max_tokens, long=options.long, on_batch=within_shard,
                                 sample=sample_for(first, first + len(texts)) if sample_for else None,
                                 qk=options.keep_qk, hidden=options.index)
                   for index, first, texts in shards)
    else:
        results = run_shards_on_ray(model, shards, options, ray_address, ray_num_cpus, sample_for)
    try:
        for result in results:
            save(result)
        manifest["complete"] = counts["done"] == len(corpus)
        if manifest["complete"] and options.index and plan is not None:
            manifest["sample"]["index"] = build_indexes(out)
    finally:
        close = getattr(results, "close", None)
        if close is not None:
            close()  # a generator's cleanup (Ray cancels its tasks) runs now, not at garbage collection
        if len(store.done_parts(out)) != len(done) + len(saved):
            # Interrupted between a part's write and its sums': the parts on disk are the truth a resume reads
            sums, tally = store.tally_parts(out, n_layers, n_heads)
            counts.update(tally)
            store.write_head_stats(out, sums, rules)
        elif not (out / store.HEAD_STATS).exists():
            store.write_head_stats(out, sums, rules)
        elapsed = time.perf_counter() - start
        tokens_per_s = counts["tokens"] / (seconds_before + elapsed) if seconds_before + elapsed > 0 else None
        manifest["timings"] = {"seconds": round(seconds_before + elapsed, 3),
                               "texts_per_s": round(new_texts / elapsed, 2) if elapsed > 0 else None,
                               "tokens_per_s": round(tokens_per_s, 1) if tokens_per_s else None}
        store.write_manifest(out, manifest)
    return store.open_run(out)
