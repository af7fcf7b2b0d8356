"""Corpus mode: Clark et al.'s head statistics over many texts, streamed in shards, locally or on Ray.

The pieces, bottom-up: ``sources`` reads texts, ``stats`` computes a padded batch's statistics and the
sums that merge across shards, ``batches`` runs one shard, ``run`` drives the shards into a run
folder, ``store`` reads and writes that folder, ``ray_engine`` runs shards on a Ray cluster.
"""

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

__all__ = [
    "PATTERN_TYPES", "Corpus", "CorpusInputError", "CorpusModel", "CorpusRun", "CorpusRunError",
    "LoadedCorpusModel", "PatternRules", "Progress", "RunOptions", "StatSums", "demo_corpus", "open_run",
    "pattern_types", "read_hub_dataset", "read_path", "read_upload", "run_corpus", "table_columns",
]
