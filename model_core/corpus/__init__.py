"""Corpus mode: Clark et al.'s head statistics over many texts, streamed in shards, locally or on Ray.

The pieces, bottom-up: ``sources`` reads texts, ``stats`` computes a padded batch's statistics and the
sums that merge across shards, ``batches`` runs one shard, ``run`` drives the shards into a run
folder, ``store`` reads and writes that folder, ``ray_engine`` runs shards on a Ray cluster. The names below load on
first use (``model_core.lazy``), so the command line's parser reads ``corpus.sample`` without importing a model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from model_core.lazy import lazy_exports

_HOMES = {
    **dict.fromkeys(("CorpusModel", "LoadedCorpusModel"), "model_core.corpus.model"),
    **dict.fromkeys(("Progress", "RunOptions", "run_corpus"), "model_core.corpus.run"),
    **dict.fromkeys(("Corpus", "CorpusInputError", "demo_corpus", "read_hub_dataset", "read_path", "read_upload",
                     "table_columns"), "model_core.corpus.sources"),
    **dict.fromkeys(("PATTERN_TYPES", "PatternRules", "StatSums", "pattern_types"), "model_core.corpus.stats"),
    **dict.fromkeys(("CorpusRun", "CorpusRunError", "open_run"), "model_core.corpus.store"),
}
"""Each public name and the module it lives in."""

__all__ = sorted(_HOMES)

if TYPE_CHECKING:  # what type checkers and editors see: the same names, imported eagerly
    from model_core.corpus.model import CorpusModel, LoadedCorpusModel
    from model_core.corpus.run import Progress, RunOptions, run_corpus
    from model_core.corpus.sources import (
        Corpus,
        CorpusInputError,
        demo_corpus,
        read_hub_dataset,
        read_path,
        read_upload,
        table_columns,
    )
    from model_core.corpus.stats import PATTERN_TYPES, PatternRules, StatSums, pattern_types
    from model_core.corpus.store import CorpusRun, CorpusRunError, open_run

__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
