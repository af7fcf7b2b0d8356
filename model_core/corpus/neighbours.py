"""Nearest contexts of a token (exBERT): run the run's model on a text, and find the corpus tokens whose
hidden state at a layer is closest (cosine) to the chosen token's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from model_core.corpus.index import index_path, search
from model_core.corpus.model import CorpusModel, LoadedCorpusModel
from model_core.corpus.sample import array_path
from model_core.corpus.store import CorpusRun, CorpusRunError, open_run


def _require_index(run: CorpusRun) -> dict[str, Any]:
    info = (run.manifest.get("sample") or {}).get("index")
    if not info or not index_path(run.path, 0).exists():
        raise CorpusRunError(f"{str(run.path)!r} has no nearest-context index: run the corpus again with --index "
                             "(the Corpus page's runs always build one).")
    return info


def sample_tokens(run: CorpusRun):
    """The sample's tokens (row, text_id, position, token) as a pyarrow table, read once per run."""
    if "sample_tokens" not in run._texts:
        import pyarrow.parquet as pq  # pyarrow costs ~0.3 s to import: only a run folder's readers pay it

        run._texts["sample_tokens"] = pq.read_table(array_path(run.path, "tokens").with_suffix(".parquet"))
    return run._texts["sample_tokens"]


def token_states(loaded: LoadedCorpusModel, text: str, text_b: str | None = None) -> tuple[tuple[str, ...], np.ndarray]:
    """The tokens of a text and its hidden states at every layer (0 = embeddings), as the run's model sees it.

    Shape: -> (layer + 1, pos, hidden) float32.
    """
    encoded = loaded.family.encode(loaded.tokenizer, text, text_b or "", max_tokens=min(512, loaded.max_positions))
    ids = encoded.input_ids.to(loaded.device)
    types = encoded.token_type_ids.to(loaded.device)
    _, vectors = loaded.forward(ids, types, torch.ones_like(ids), hidden=True)
    return encoded.tokens, torch.stack([h[0] for h in vectors.hidden]).to("cpu", torch.float32).numpy()


def neighbours_of(run: CorpusRun, states: np.ndarray, tokens: tuple[str, ...], *, position: int, layer: int,
                  k: int = 10) -> list[dict[str, Any]]:
    """The ``k`` corpus tokens nearest to ``tokens[position]`` at ``layer``, best first.

    Returns:
        Dicts of ``text_index``, ``position``, ``token``, ``text`` (sentence A), ``text_b``, ``score`` (cosine).
    """
    info = _require_index(run)
    if not 0 <= position < len(tokens):
        raise ValueError(f"Position {position} is out of range: the text has {len(tokens)} tokens "
                         f"(positions 0-{len(tokens) - 1}, [CLS] and [SEP] included).")
    if not 0 <= layer < info["layers"]:
        raise ValueError(f"Layer {layer} does not exist: this run's model has layers 0-{info['layers'] - 1} "
                         "(0 = the embeddings).")
    if not 1 <= k <= 1000:
        raise ValueError(f"k must be between 1 and 1000, got {k}.")
    scores, rows = search(run.path, layer, states[layer, position], k)
    table = sample_tokens(run)
    texts = run.texts()
    where = {int(t): i for i, t in enumerate(texts["text_id"].to_numpy())}
    out = []
    for score, row in zip(scores, rows):
        text_id = int(table["text_id"][int(row)].as_py())
        i = where[text_id]
        out.append({"text_index": text_id, "position": int(table["position"][int(row)].as_py()),
                    "token": table["token"][int(row)].as_py(), "text": texts["text_a"][i].as_py(),
                    "text_b": texts["text_b"][i].as_py(), "score": round(float(score), 6)})
    return out


def neighbours(run_dir: str | Path, text: str, text_b: str | None = None, *, position: int, layer: int, k: int = 10,
               loaded: LoadedCorpusModel | None = None, device: str | None = None) -> list[dict[str, Any]]:
    """One call from a run folder and a text to the nearest corpus contexts (what the CLI prints).

    Raises:
        CorpusRunError: not a run, or a run without an index.
        ValueError: position, layer or k out of range; a text the model cannot take.
    """
    run = open_run(run_dir)
    _require_index(run)
    loaded = loaded or CorpusModel.from_key(run.manifest["model"]).load(device)
    tokens, states = token_states(loaded, text, text_b)
    return neighbours_of(run, states, tokens, position=position, layer=layer, k=k)
