"""The head atlas: what every head does across a corpus, each head on one card.

The pieces, bottom-up: ``scan`` finds each text's best (query, key) per head and the profile sums of a padded batch,
``shard`` runs one shard, ``store`` reads and writes the atlas folder, ``contexts`` picks top contexts and decile
samples, ``why`` runs the QK split and the direct logit effect at a few contexts, ``ov`` scores copying from the
weights, ``summary`` names each head by fixed rules, ``run`` drives it all. The names below load on first use
(``model_core.lazy``), so ``atlas --show`` and ``--help`` read a folder without importing a model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from model_core.lazy import lazy_exports

_HOMES = {
    **dict.fromkeys(("AtlasOptions", "AtlasProgress", "run_atlas"), "model_core.atlas.run"),
    **dict.fromkeys(("AtlasRun", "AtlasRunError", "SHOW_KEYS", "open_atlas"), "model_core.atlas.store"),
    **dict.fromkeys(("KINDS", "SummaryRules", "summarise"), "model_core.atlas.summary"),
    **dict.fromkeys(("PROFILE_KEYS",), "model_core.atlas.keys"),
    **dict.fromkeys(("copying_scores",), "model_core.atlas.ov"),
}
"""Each public name and the module it lives in."""

__all__ = sorted(_HOMES)

if TYPE_CHECKING:  # what type checkers and editors see: the same names, imported eagerly
    from model_core.atlas.keys import PROFILE_KEYS
    from model_core.atlas.ov import copying_scores
    from model_core.atlas.run import AtlasOptions, AtlasProgress, run_atlas
    from model_core.atlas.store import SHOW_KEYS, AtlasRun, AtlasRunError, open_atlas
    from model_core.atlas.summary import KINDS, SummaryRules, summarise

__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
