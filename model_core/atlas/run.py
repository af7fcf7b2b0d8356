"""``run_atlas``: scan a corpus shard by shard into an atlas folder, then write every head's card.

Two stages. The **scan** streams the texts through the model in padded, length-sorted batches (corpus mode's
tokenising and batching) and keeps, per text and head, the best (query, key) pair of each list and the profile sums;
each shard is a part on disk, so an interrupted atlas keeps what it did and a rerun continues. The **cards** read the
parts: top contexts and decile samples with their snippets, the profile, then what needs the model again at a few
contexts (the QK split, the direct logit effect: one full trace per text), and what needs only the weights (the OV
copying score, the composition partners) or a probe (the Head roles scores).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

import model_core.atlas.store as store
from model_core.atlas.contexts import TOP_K, TokenText, context, decile_samples, top_texts
from model_core.atlas.keys import LISTS, PROFILE_KEYS, ROW_KEYS
from model_core.atlas.ov import TOP_N, copying_scores
from model_core.atlas.picks import PICKS, Pick, qk_picks
from model_core.atlas.qk_fast import TextSplit
from model_core.atlas.shard import LONG_FROM, process_shard
from model_core.atlas.summary import SummaryRules, kind_of, summarise
from model_core.atlas.why import CARD_BATCH, CARD_CELL_BUDGET, QKAverage, explain
from model_core.compact.trace import QUERY_BLOCK
from model_core.corpus.batches import EncodedText, encode_texts, largest_batch
from model_core.corpus.model import CorpusModel, LoadedCorpusModel
from model_core.corpus.sources import Corpus
from model_core.models.memory import release_freed_memory
from model_core.models.run_memory import (
    atlas_bytes,
    check_run_memory,
    device_of,
    model_shape,
    run_memory_limit_mb,
)
from model_core.qk.composition import KINDS, composition_scores
from model_core.roles.probes import SEQ_LEN, probe_inputs, probe_texts, usable_words, word_pool
from model_core.roles.scores import PROBE_ROLES, role_scores

Engine = Literal["local", "ray"]
ATLAS_MAX_TOKENS = 4096
"""The longest text an atlas reads (longer ones are truncated or skipped, ``--long``); from ``LONG_FROM`` tokens a text
is scanned alone through the compact pass."""
TOP_COMPONENTS = 3
TOP_PARTNERS = 3
TOP_TOKENS = 10


@dataclass(frozen=True)
class AtlasOptions:
    """How an atlas is run. Recorded in the manifest; a rerun keeps the original's.

    Attributes:
        qk_contexts: contexts per head (from its list without the sink) for the QK split and the direct logit
            effect; 0 skips both. A context in a text of ``LONG_FROM`` tokens or more is split from that text's own
            pass without its n x n weights (``model_core.atlas.long_arrays``).
        qk_pick: which of them (``model_core.atlas.picks``): ``first``, the head's first ``qk_contexts``; ``shared``,
            its first and others of its top K chosen so that few texts serve every head (2.6x fewer passes over
            1,000 texts); ``auto``, ``first`` unless it names more than 200 texts.
    """

    batch_size: int = 32
    chunk_size: int = 128
    max_tokens: int = ATLAS_MAX_TOKENS
    long: Literal["truncate", "skip"] = "truncate"
    top_k: int = TOP_K
    qk_contexts: int = 3
    qk_pick: Pick = "auto"
    top_n: int = TOP_N
    roles_seed: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.batch_size <= 4096:
            raise ValueError(f"--batch-size must be between 1 and 4096, got {self.batch_size}.")
        if not 1 <= self.chunk_size <= 1_000_000:
            raise ValueError(f"--shard-size must be between 1 and 1,000,000, got {self.chunk_size}.")
        if not 5 <= self.max_tokens <= ATLAS_MAX_TOKENS:
            raise ValueError(f"--max-tokens must be between 5 and {ATLAS_MAX_TOKENS:,}, got {self.max_tokens}.")
        if self.long not in ("truncate", "skip"):
            raise ValueError(f"--long must be 'truncate' or 'skip', got {self.long!r}.")
        if not 1 <= self.top_k <= 1000 or not 0 <= self.qk_contexts <= self.top_k:
            raise ValueError(f"--qk-contexts must be between 0 and the top K ({self.top_k}), got {self.qk_contexts}.")
        if self.qk_pick not in PICKS:
            raise ValueError(f"--qk-pick must be one of {', '.join(PICKS)}, got {self.qk_pick!r}.")
        if self.top_n < 2:
            raise ValueError(f"The OV circuit needs at least 2 tokens, got {self.top_n}.")


@dataclass(frozen=True)
class AtlasProgress:
    """Where a run stands: ``stage`` "scan" (texts) or "cards" (texts traced for the QK split), done of total."""

    stage: str
    done: int
    total: int
    elapsed_s: float


def _shards(corpus: Corpus, size: int) -> list[tuple[int, int, list[tuple[str, str | None]]]]:
    return [(i, start, list(corpus.texts[start:start + size])) for i, start in enumerate(range(0, len(corpus), size))]


def _prepare(out: Path, corpus: Corpus, model: CorpusModel, options: AtlasOptions) -> tuple[AtlasOptions, dict]:
    """A new folder, or the atlas already there if it is of the same model and texts (then its options)."""
    if (out / store.MANIFEST).exists():
        manifest = store.read_manifest(out)
        if CorpusModel.from_key(manifest["model"]).key() != model.key():
            theirs = CorpusModel.from_key(manifest["model"]).label()
            raise store.AtlasRunError(f"{str(out)!r} holds an atlas of {theirs}, not {model.label()}; continue it with "
                                      "the same model, or choose another --out folder.")
        if manifest["corpus"]["fingerprint"] != corpus.fingerprint:
            raise store.AtlasRunError(f"{str(out)!r} holds an atlas of other texts (corpus hash differs); continue it "
                                      "with the same input and --limit, or choose another --out folder.")
        return AtlasOptions(**manifest["options"]), manifest
    if out.exists() and any(out.iterdir()):
        raise store.AtlasRunError(f"{str(out)!r} is not empty and is not an atlas; choose a new --out folder.")
    out.mkdir(parents=True, exist_ok=True)
    return options, {}


def run_atlas(corpus: Corpus, model: CorpusModel, out: str | Path, *, options: AtlasOptions = AtlasOptions(),
              loaded: LoadedCorpusModel | None = None, engine: Engine = "local", device: str | None = None,
              ray_address: str | None = None, ray_num_cpus: int | None = None,
              circuit: str | Path | dict | None = None,
              rules: SummaryRules = SummaryRules(),
              progress: Callable[[AtlasProgress], None] | None = None) -> store.AtlasRun:
    """Scan ``corpus`` through ``model`` into the atlas folder ``out`` and write every head's card.

    A folder that already holds an atlas of the same model and texts is continued: finished shards are kept, and a
    finished atlas is returned as it is. ``progress`` is called after every batch and every traced text; raising
    from it (a Stop) ends the run with every finished shard on disk.

    Args:
        loaded: an already loaded copy of ``model`` (the app's cached one); loaded here if None.
        engine: "local" (this process) or "ray" (one Ray task per shard).
        circuit: a circuit run of the same model (``circuit --json``'s object, or its file) for each head's node score.

    Raises:
        AtlasRunError: ``out`` holds something else, or an atlas of another model or corpus.
        ModelLoadError, ValueError: the model or an option cannot be used.
    """
    out = Path(out).expanduser()
    options, previous = _prepare(out, corpus, model, options)
    if previous.get("finished"):
        return store.open_atlas(out)
    if engine not in ("local", "ray"):
        raise ValueError(f"--engine must be 'local' or 'ray', got {engine!r}.")
    loaded = loaded if loaded is not None else model.load(device)
    check_atlas_memory(loaded, options)
    n_layers, n_heads = loaded.n_layers, loaded.n_heads
    manifest = {
        "format": store.FORMAT, "format_version": store.FORMAT_VERSION, "complete": False, "finished": False,
        "model": model.key(), "model_description": loaded.description, "n_layers": n_layers, "n_heads": n_heads,
        "is_decoder": loaded.family.is_decoder,
        "corpus": {"name": corpus.name, "fingerprint": corpus.fingerprint, "n_texts": len(corpus)},
        "options": asdict(options), "engine": engine, "device": str(loaded.device),
        "timings": previous.get("timings", {"scan_s": 0.0, "cards_s": 0.0}),
    }
    store.write_json(out / store.MANIFEST, manifest)
    start = time.perf_counter()
    done = set(store.done_parts(out))
    shards = [s for s in _shards(corpus, options.chunk_size) if s[0] not in done]
    finished = sum(len(t) for i, _, t in _shards(corpus, options.chunk_size) if i in done)

    def tick(stage: str, n: int, total: int) -> None:
        if progress is not None:
            progress(AtlasProgress(stage, n, total, time.perf_counter() - start))

    scan_before = float(manifest["timings"].get("scan_s", 0.0))
    if engine == "ray":
        from model_core.atlas.ray_engine import run_shards_on_ray  # noqa: PLC0415 (Ray is optional and seconds to import)

        results = run_shards_on_ray(model, shards, options, ray_address, ray_num_cpus)
    else:
        results = (process_shard(loaded, index, first, texts, batch_size=options.batch_size,
                                 max_tokens=options.max_tokens, long=options.long,
                                 on_batch=lambda n, f=finished: tick("scan", f + n, len(corpus)))
                   for index, first, texts in shards)
    try:
        for result in results:
            store.write_part(out, result)
            finished += len(result.text_ids)
            release_freed_memory()
            manifest["timings"]["scan_s"] = round(scan_before + time.perf_counter() - start, 3)
            store.write_json(out / store.MANIFEST, manifest)
            tick("scan", finished, len(corpus))
    finally:
        close = getattr(results, "close", None)
        if close is not None:
            close()  # a generator's cleanup (Ray cancels its tasks) runs now
    manifest["complete"] = True
    store.write_json(out / store.MANIFEST, manifest)
    cards_start = time.perf_counter()
    heads = build_cards(loaded, corpus, store.read_parts(out, n_layers, n_heads), options, circuit=circuit,
                        rules=rules, progress=lambda n, total: tick("cards", n, total))
    store.write_cards(out, heads)
    manifest["finished"] = True
    manifest["timings"]["cards_s"] = round(time.perf_counter() - cards_start, 3)
    store.write_json(out / store.MANIFEST, manifest)
    return store.open_atlas(out)


def check_atlas_memory(loaded: LoadedCorpusModel, options: AtlasOptions) -> None:
    """Refuse, before the first pass, an atlas whose peak (``run_memory.atlas_bytes`` at ``options.max_tokens``)
    would pass ``AE_RUN_MEMORY_MB``.

    Raises:
        RunMemoryError (a ValueError): the estimate, the limit and what to lower.
    """
    tokens = min(options.max_tokens, loaded.max_positions)
    short, heads = max(1, min(tokens, LONG_FROM - 1)), loaded.n_layers * loaded.n_heads
    estimate = atlas_bytes(model_shape(loaded.module), tokens, largest_batch(options.batch_size, short, heads),
                           largest_batch(CARD_BATCH, short, heads, CARD_CELL_BUDGET), long_from=LONG_FROM,
                           block=QUERY_BLOCK, chunk=TextSplit.CHUNK_BYTES)
    check_run_memory(f"An atlas of texts up to {tokens:,} tokens", estimate,
                     run_memory_limit_mb(device=device_of(loaded.module)),
                     "Lower --max-tokens (the page's texts are cut at 128) or --batch-size.")


# -- the cards ---------------------------------------------------------------------------------------
def profile_of(sums: np.ndarray, rows: np.ndarray) -> dict[str, float | None]:
    """One head's profile from its sums (profile,) and the row counts (3,): shares and mean entropy, None where no
    row counts."""
    out: dict[str, float | None] = {}
    for i, key in enumerate(PROFILE_KEYS):
        count = rows[0] if key in ROW_KEYS else rows[1] if key == "same_token" else rows[2]
        out[key] = float(sums[i] / count) if count else None
    return out


def _encoded(loaded: LoadedCorpusModel, corpus: Corpus, text_ids: set[int], options: AtlasOptions
             ) -> dict[int, EncodedText]:
    limit = min(options.max_tokens, loaded.max_positions)
    out = {}
    for text_id in sorted(text_ids):
        encoded, _ = encode_texts(loaded.tokenizer, [corpus.texts[text_id]], text_id, limit, options.long,
                                  loaded.family)
        out[text_id] = encoded[0]
    return out


def _sides(avg: QKAverage | None) -> dict[str, list[list[Any]]] | None:
    """The top components on each side, with their share of the score above the row mean."""
    if avg is None:
        return None
    total = avg.above_mean if abs(avg.above_mean) > 1e-12 else float("nan")
    pick = lambda side: [[avg.components[i], _finite(side[i] / total)]  # noqa: E731
                         for i in np.argsort(-side, kind="stable")[:TOP_COMPONENTS]]
    return {"query_side": pick(avg.query_side), "key_side": pick(avg.key_side)}


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def role_grids(loaded: LoadedCorpusModel, seed: int = 0) -> dict[str, np.ndarray]:
    """The Head roles page's probe scores (previous-token, duplicate-token, induction, sink) of every head, on the
    loaded model. Shape: each (layer, head)."""
    seq_len = SEQ_LEN  # a small vocabulary's probe is shorter, as the Head roles page's (``score_roles``)
    if len(word_pool(loaded.tokenizer)) < 4 * SEQ_LEN and (usable := usable_words(loaded.tokenizer)) < SEQ_LEN:
        seq_len = max(usable, 8)
    inputs = probe_inputs(loaded, probe_texts(loaded.tokenizer, seed, seq_len=seq_len))
    sums: dict[str, np.ndarray] = {}
    for x in inputs:
        for role, grid in role_scores(x).items():
            sums[role] = sums.get(role, 0.0) + grid
    return {role: sums[role] / len(inputs) for role in PROBE_ROLES}


def composition_partners(loaded: LoadedCorpusModel) -> dict[tuple[int, int], dict[str, Any]] | None:
    """Each head's top Q-, K- and V-composition partners, in (earlier heads into it) and out (later heads it feeds);
    None for a model of one layer."""
    if loaded.n_layers < 2:
        return None
    scores = composition_scores(loaded.module)
    labels = scores.labels()
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for index, label in enumerate(labels):
        entry: dict[str, Any] = {}
        for kind in KINDS:
            grid = scores.scores(kind)
            partners = {}
            for side, values in (("in", grid[:, index]), ("out", grid[index, :])):
                finite = np.where(np.isfinite(values), values, -np.inf)
                order = np.argsort(-finite, kind="stable")[:TOP_PARTNERS]
                partners[side] = [[labels[j], float(values[j])] for j in order if np.isfinite(values[j])]
            entry[kind] = partners
        out[divmod(index, loaded.n_heads)] = entry
    return out


def circuit_node_scores(circuit: str | Path | dict | None, n_layers: int, n_heads: int) -> np.ndarray | None:
    """Each head's node score in a circuit run (``circuit --json``): the sum of |score| of the edges that touch it
    (as the sender ``a{l}.h{h}`` or a receiver ``a{l}.h{h}<q|k|v>``). Shape: -> (layer, head), or None."""
    if circuit is None:
        return None
    data = circuit if isinstance(circuit, dict) else json.loads(Path(circuit).read_text(encoding="utf-8"))
    grid = np.zeros((n_layers, n_heads))
    for sender, receiver, score in data.get("edges", []):
        if score is None:
            continue
        for name in (sender, receiver.split("<")[0]):
            if name.startswith("a") and ".h" in name:
                layer, head = (int(x) for x in name[1:].split(".h"))
                if layer < n_layers and head < n_heads:
                    grid[layer, head] += abs(float(score))
    return grid


def build_cards(loaded: LoadedCorpusModel, corpus: Corpus, scanned: store.Scanned, options: AtlasOptions, *,
                circuit: str | Path | dict | None = None, rules: SummaryRules = SummaryRules(),
                progress: Callable[[int, int], None] | None = None) -> list[dict[str, Any]]:
    """Every head's card, layer-major, from the scanned parts (the module's docstring)."""
    n_layers, n_heads = loaded.n_layers, loaded.n_heads
    ids = scanned.text_ids
    if progress is not None:
        progress(0, 0)  # the cards begin
    tops: dict[tuple[int, int], list[np.ndarray]] = {}
    deciles: dict[tuple[int, int], list[np.ndarray]] = {}
    needed: set[int] = set()
    for layer in range(n_layers):
        for head in range(n_heads):
            lists = [top_texts(scanned.best_w[:, i, layer, head], ids, options.top_k) for i in range(len(LISTS))]
            groups = decile_samples(scanned.best_w[:, 1, layer, head], ids)
            tops[(layer, head)], deciles[(layer, head)] = lists, groups
            for rows in (*lists, *groups):
                needed.update(int(ids[r]) for r in rows)
    texts = _encoded(loaded, corpus, needed, options)
    token_ids = {t: e.ids for t, e in texts.items()}
    text_of = TokenText(loaded.tokenizer)

    def contexts(layer: int, head: int, rows: np.ndarray, which: int) -> list[dict[str, Any]]:
        return [context(int(r), ids, scanned.best_w[:, which, layer, head], scanned.best_q[:, which, layer, head],
                        scanned.best_k[:, which, layer, head], token_ids, text_of) for r in rows]

    ranks = qk_picks({lh: [int(ids[r]) for r in rows[1]] for lh, rows in tops.items()}, options.qk_contexts,
                     options.qk_pick)
    wanted = {lh: [(int(ids[r]), int(scanned.best_q[r, 1, lh[0], lh[1]]), int(scanned.best_k[r, 1, lh[0], lh[1]]))
                   for r in (tops[lh][1][i] for i in picked)] for lh, picked in ranks.items()}
    averages, effects = explain(loaded, texts, wanted, qk=options.qk_contexts > 0, effects=options.qk_contexts > 0,
                                long_from=LONG_FROM, progress=progress) if wanted else ({}, {})
    copying = copying_scores(loaded.module, loaded.tokenizer, options.top_n)
    roles = role_grids(loaded, options.roles_seed)
    partners = composition_partners(loaded)
    nodes = circuit_node_scores(circuit, n_layers, n_heads)
    profiles = {(la, h): profile_of(scanned.sums[la, h], scanned.rows) for la in range(n_layers) for h in range(n_heads)}
    previous = frozenset(f"L{la}H{h}" for (la, h), p in profiles.items() if kind_of(p, rules)[0] == "previous-token")
    cards = []
    for layer in range(n_layers):
        for head in range(n_heads):
            lh = (layer, head)
            profile = profiles[lh]
            qk = _sides(averages.get(lh))
            copy = None if copying is None else float(copying[layer, head])
            effect = effects.get(lh)
            promoted = None
            if copying is not None:
                promoted = [] if effect is None else \
                    [[text_of(int(t)), float(effect[t])] for t in np.argsort(-effect, kind="stable")[:TOP_TOKENS]]
            kind, summary = summarise(profile, qk["key_side"] if qk else None, copy, rules, previous)
            role = {r: _finite(float(g[layer, head])) for r, g in roles.items()}
            role["circuit_node_score"] = None if nodes is None else float(nodes[layer, head])
            cards.append({
                "layer": layer, "head": head, "summary": summary,
                "top_contexts": contexts(layer, head, tops[lh][0], 0),
                "top_contexts_no_sink": contexts(layer, head, tops[lh][1], 1),
                "deciles": [contexts(layer, head, rows, 1) for rows in deciles[lh]],
                "profile": profile, "qk": qk, "copying_score": copy, "promoted_tokens": promoted,
                "roles": role, "composition": None if partners is None else partners[lh],
                "kind": kind, "qk_contexts": len(wanted.get(lh, [])), "qk_context_ranks": ranks.get(lh, []),
            })
    return cards
