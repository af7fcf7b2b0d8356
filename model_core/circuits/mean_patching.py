"""Mean activation patching over a dataset of prompt pairs: each pair through the one per-pair pipeline
(``model_core.effects.patching_run.PatchingPipeline``: its inputs checked, both runs, exact patching), then each
head's mean effect and its spread over the pairs, and the residual stream's mean per (layer, position) where every
pair shares one template (one token count).

An effect is normalised per pair, (m_patched − m_corrupt) / (m_clean − m_corrupt), as on the patching page; the
spread is the population standard deviation of the pairs' effects (0 for one pair).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from model_core.circuits.datasets import (
    Dataset,
    Pair,
    Problem,
    Validated,
    load_dataset,
    validate,
)
from model_core.effects.patching import Stop, prepare_runs
from model_core.effects.patching_inputs import require_decoder
from model_core.effects.patching_run import PatchingPipeline, check_patching_memory
from model_core.trace.request import TraceRequest
from model_core.trace.resolve import resolve

Progress = Callable[[float, int], None]
"""Called with (pairs done, counting the current one's share of its patched passes; pairs to run)."""


@dataclass(frozen=True, eq=False)
class PairEffects:
    """One pair's exact patching. Shape: heads (layer, head); residual (layer, pos) or None."""

    row: int
    clean: float
    corrupt: float
    heads: np.ndarray
    residual: np.ndarray | None


@dataclass(frozen=True, eq=False)
class MeanPatching:
    """Exact patching averaged over the pairs run.

    Attributes:
        n: the pairs run. clean, corrupt: their mean metric M on the clean and the corrupted prompts.
        heads: each head's mean effect. heads_std: its spread (population std) over the pairs.
        residual: the mean effect of patching resid_pre per (layer, position), or None where it is left out
            (``residual_note`` says why).
        problems: a line for every pair that did not run ("pair 3 (row 3): ...").
        tokens: the first pair's clean tokens, to label the residual grid's positions.
        partial: a Stop ended the run; ``n`` counts the pairs finished. to_run: the valid pairs there were.

    Shape: heads, heads_std (layer, head); residual (layer, pos).
    """

    n: int
    heads: np.ndarray
    heads_std: np.ndarray
    residual: np.ndarray | None
    problems: tuple[str, ...]
    clean: float
    corrupt: float
    tokens: tuple[str, ...] = ()
    residual_note: str | None = None
    partial: bool = False
    to_run: int = 0

    def to_json(self) -> dict[str, Any]:
        """The ``patch --dataset`` JSON: {"n", "heads" (L × H mean effect), "heads_std" (L × H), "residual" (layer ×
        position mean, or null), "problems", "clean", "corrupt"}; NaN as null."""
        return {"n": self.n, "heads": _listed(self.heads), "heads_std": _listed(self.heads_std),
                "residual": None if self.residual is None else _listed(self.residual),
                "problems": list(self.problems), "clean": _number(self.clean), "corrupt": _number(self.corrupt)}


def _number(value: float) -> float | None:
    return float(value) if math.isfinite(float(value)) else None


def _listed(grid: np.ndarray) -> list:
    return [[_number(v) for v in row] for row in np.asarray(grid, dtype=np.float64)]


def combine(done: Sequence[PairEffects], shape: tuple[int, int], problems: Sequence[str], *,
            tokens: tuple[str, ...] = (), residual_note: str | None = None, partial: bool = False,
            to_run: int = 0) -> MeanPatching:
    """The mean and spread of the pairs' effects (NaN grids when none finished)."""
    if not done:
        empty = np.full(shape, np.nan)
        return MeanPatching(0, empty, empty.copy(), None, tuple(problems), float("nan"), float("nan"), tokens,
                            residual_note, partial, to_run)
    heads = np.stack([d.heads for d in done])  # (pair, layer, head)
    residual = None
    if all(d.residual is not None for d in done) and len({d.residual.shape for d in done}) == 1:
        residual = np.stack([d.residual for d in done]).mean(axis=0)  # (layer, pos)
    return MeanPatching(len(done), heads.mean(axis=0), heads.std(axis=0), residual, tuple(problems),
                        float(np.mean([d.clean for d in done])), float(np.mean([d.corrupt for d in done])), tokens,
                        residual_note, partial, to_run)


def residual_plan(checked: Validated, residual: bool) -> tuple[bool, str | None]:
    """Whether to patch the residual stream, and when not, why (the pairs' token counts differ, or not asked)."""
    if not residual:
        return False, "The residual stream was not asked for."
    if checked.n_tokens is None:
        counts = sorted({p.n_tokens for p in checked.pairs})
        return False, (f"The residual stream is left out: the pairs have {counts[0]} to {counts[-1]} tokens, so their "
                       "positions do not line up. Give pairs of one template (one token count) to average it.")
    return True, None


def mean_patching(resolved: Any, dataset: Dataset | Sequence[Pair], *, residual: bool = True,
                  progress: Progress | None = None, stop: Stop | None = None,
                  keep: Callable[[MeanPatching], None] | None = None) -> MeanPatching:
    """Exact patching of every valid pair of ``dataset`` on ``resolved``'s decoder, averaged.

    Each pair is checked against the tokenizer first (``datasets.validate``); a pair that fails, or whose clean and
    corrupted metrics are equal, becomes a problem and the others run.

    Args:
        resolved: a ``model_core.trace.resolve.Resolved`` pretrained decoder.
        residual: also patch the residual stream per (layer, position), where the pairs share one token count.
        progress: called with (pairs done, with the current one's share; pairs to run) as batches finish.
        stop: asked before each pair and each batch; True keeps the finished pairs, drops the one under way and
            marks the result partial.
        keep: called with the result so far after each pair (a Streamlit run cut short keeps it).

    Raises:
        DatasetError: no pair of the dataset is valid (the message lists the problems).
        NotADecoder: an encoder.
        RunMemoryError: not even the shortest pair fits ``AE_RUN_MEMORY_MB`` (a longer pair that does not fit is a
            problem, and the others run).
    """
    require_decoder(resolved.family)
    checked = validate(dataset, resolved.tokenizer).require()
    patch_residual, note = residual_plan(checked, residual)
    check_patching_memory(resolved, min(p.n_tokens for p in checked.pairs), attribution=False)  # none would fit
    problems = list(checked.messages)
    done: list[PairEffects] = []
    total = len(checked.pairs)
    shape, tokens = _grid_shape(resolved.model), ()

    def result(partial: bool) -> MeanPatching:
        return combine(done, shape, problems, tokens=tokens, residual_note=note, partial=partial, to_run=total)

    for i, tok in enumerate(checked.pairs):
        if stop is not None and stop():
            return result(True)
        if progress is not None:
            progress(float(i), total)
        pair = tok.pair
        try:
            check_patching_memory(resolved, tok.n_tokens, attribution=False)
            pipeline = PatchingPipeline.prepare(resolved, pair.clean, pair.corrupt, pair.answer, pair.foil)
            runs = prepare_runs(resolved.family, resolved.model, pipeline.inputs)
        except ValueError as exc:  # PatchingError: the same tokens, or equal metrics
            problems.append(str(Problem(tok.row, str(exc))))
            continue
        within = None if progress is None else (lambda d, t, i=i: progress(i + d / max(t, 1), total))
        exact = pipeline.exact(runs, residual=patch_residual, progress=within, stop=stop)
        if exact.partial:  # stopped inside this pair: its effects are incomplete, so it is not counted
            return result(True)
        if not tokens:
            tokens = pipeline.inputs.clean_tokens
        done.append(PairEffects(tok.row, runs.clean, runs.corrupt, exact.heads,
                                exact.residual if patch_residual else None))
        if keep is not None:
            keep(result(i + 1 < total))
    if progress is not None:
        progress(float(total), total)
    return result(False)


def _grid_shape(model: Any) -> tuple[int, int]:
    config = getattr(model.config, "text_config", None) or model.config
    return int(config.num_hidden_layers), int(config.num_attention_heads)


def patch_dataset(source: str | Dataset | Sequence[Pair], *, model_id: str | None = None,
                  device: str | torch.device | None = None, settings: Any = None, models: Any = None,
                  residual: bool = True, progress: Progress | None = None, stop: Stop | None = None) -> MeanPatching:
    """Mean patching of a pretrained decoder over a dataset, from scratch: ``source`` is a JSONL or CSV file, a
    generator spec (``ioi:8:0``), a ``Dataset`` or a list of pairs.

    Raises:
        DatasetError: the dataset cannot be read, or no pair is valid.
        NotADecoder, ModelLoadError: the model cannot be patched or loaded.
    """
    dataset = load_dataset(source) if isinstance(source, str) else source
    resolved = resolve(TraceRequest("pretrained", "", "", model_id=model_id), device=device, settings=settings,
                       models=models)
    return mean_patching(resolved, dataset, residual=residual, progress=progress, stop=stop)
