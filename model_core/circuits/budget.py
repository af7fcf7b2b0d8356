"""A circuit run's budget before it starts: batches sized to fit ``AE_RUN_MEMORY_MB`` (long pairs run fewer to a
batch, and a pair that does not fit alone is refused with the estimate and the limit), the first pairs an upload
may run on a page (``AE_MAX_PAIRS``), and the time the run will take, from one timed pass of its first batch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from model_core.circuits.datasets import Dataset, Problem, TokenizedPair
from model_core.circuits.eap import DEFAULT_BATCH, CircuitModel, PairBatch, make_batches
from model_core.circuits.faithfulness import FRACTIONS
from model_core.effects.patching import batch_size as copies_a_pass
from model_core.families.hooked import run_with_hooks
from model_core.gate import GATE
from model_core.models.run_memory import (
    ModelShape,
    RunMemoryError,
    circuit_batch_bytes,
    fits,
    longest_fitting,
    model_shape,
    refusal,
)


def circuit_shape(cm: CircuitModel) -> ModelShape:
    """The shape the memory estimates read (``model_core.models.run_memory``)."""
    return model_shape(cm.model)


def batch_that_fits(shape: ModelShape, tokens: int, batch_size: int, limit_mb: float, *, curve: bool = True) -> int:
    """The most pairs of ``tokens`` tokens, up to ``batch_size``, a batch may hold within ``limit_mb``; 0 when not
    even one fits."""
    if fits(circuit_batch_bytes(shape, batch_size, tokens, curve=curve), limit_mb):
        return batch_size
    return min(batch_size, longest_fitting(lambda b: circuit_batch_bytes(shape, max(b, 1), tokens, curve=curve)
                                           if b else 0.0, limit_mb, hi=batch_size))


def too_long(shape: ModelShape, tokens: int, limit_mb: float, curve: bool) -> str:
    """The refusal of one pair of ``tokens`` tokens: the estimate, the limit, and the longest pair that fits."""
    longest = longest_fitting(lambda t: circuit_batch_bytes(shape, 1, max(t, 1), curve=curve), limit_mb)
    advice = (f"Pairs of up to about {longest:,} tokens fit on this model." if longest else
              "No pair fits on this model.")
    return refusal(f"Edge attribution of a pair of {tokens:,} tokens ({shape.n_senders} senders × "
                   f"{shape.n_receivers} receivers × {tokens:,} positions × {shape.d_model} numbers, and "
                   f"{shape.n_layers} layers × {shape.n_heads} heads × {tokens:,}² attention weights)",
                   circuit_batch_bytes(shape, 1, tokens, curve=curve), limit_mb, advice)


@dataclass(frozen=True, eq=False)
class FittedBatches:
    """The batches a run makes within its memory limit.

    Attributes:
        batches: pairs of one token count each, at most as many as fit. problems: a line for each pair refused
            ("pair 3 (row 3): ... would need about N MB ..."). sizes: token count -> pairs a batch.
    """

    batches: list[PairBatch]
    problems: tuple[str, ...]
    sizes: dict[int, int]


def fitted_batches(cm: CircuitModel, pairs: Sequence[TokenizedPair], batch_size: int = DEFAULT_BATCH, *,
                   limit_mb: float, curve: bool = True) -> FittedBatches:
    """``make_batches`` with each token count's batch made smaller until it fits ``limit_mb``; the pairs that do not
    fit alone become problems.

    Raises:
        RunMemoryError: not one pair fits (the message names the estimate and the limit).
        ValueError: a batch size below 1.
    """
    if isinstance(batch_size, bool) or int(batch_size) < 1:
        raise ValueError(f"The batch size is a whole number ≥ 1, not {batch_size!r}.")
    shape = circuit_shape(cm)
    groups: dict[int, list[TokenizedPair]] = {}
    for pair in pairs:
        groups.setdefault(pair.n_tokens, []).append(pair)
    batches: list[PairBatch] = []
    problems: list[str] = []
    sizes: dict[int, int] = {}
    first_refusal = None
    for tokens, group in groups.items():
        size = batch_that_fits(shape, tokens, int(batch_size), limit_mb, curve=curve)
        if size < 1:
            message = too_long(shape, tokens, limit_mb, curve)
            first_refusal = first_refusal or message
            problems += [str(Problem(p.row, message)) for p in group]
            continue
        sizes[tokens] = size
        batches += make_batches(group, size)
    if not batches and first_refusal is not None:
        raise RunMemoryError(first_refusal)
    return FittedBatches(batches, tuple(problems), sizes)


# -- the page's cap on an upload ---------------------------------------------------------------------------------------
def first_pairs(dataset: Dataset, max_pairs: int) -> tuple[Dataset, int]:
    """The dataset's first ``max_pairs`` rows (pairs and rows that could not be read, counted together), and how many
    rows were left out."""
    total = len(dataset.pairs) + len(dataset.problems)
    if total <= max_pairs:
        return dataset, 0
    rows = sorted([*dataset.rows, *(p.row for p in dataset.problems)])
    last = rows[max_pairs - 1]
    keep = [i for i, row in enumerate(dataset.rows) if row <= last]
    lines = tuple(dataset.lines[i] for i in keep) if dataset.lines else ()
    capped = Dataset(tuple(dataset.pairs[i] for i in keep), tuple(dataset.rows[i] for i in keep),
                     tuple(p for p in dataset.problems if p.row <= last), dataset.source, lines)
    return capped, total - max_pairs


# -- the time a run will take ------------------------------------------------------------------------------------------
SCORE_PASSES_FIXED, SCORE_PASSES_A_STEP = 2.0, 4.0
"""A batch's edge scores in forward passes of the batch: two sender runs, and a forward and backward pass a step
(measured on SmolLM2: 4.3 to 7.3 passes for EAP)."""
CURVE_PASSES_FIXED, CURVE_PASSES_A_FRACTION = 2.0, 2.2
"""A batch's faithfulness curve in forward passes: a corrupted and a clean run, and a patched pass a fraction
(measured: 22 to 25 passes for the 10 fractions)."""


def passes_a_batch(steps: int, curve: bool) -> float:
    """Forward passes of its batch each batch costs (the cost model ``run_seconds`` multiplies)."""
    scores = SCORE_PASSES_FIXED + SCORE_PASSES_A_STEP * steps
    return scores + ((CURVE_PASSES_FIXED + CURVE_PASSES_A_FRACTION * len(FRACTIONS)) if curve else 0.0)


def pass_seconds(cm: CircuitModel, batch: PairBatch) -> float:
    """Seconds one forward pass of ``batch``'s clean prompts takes here, now (the calibration pass, in the gate's
    turn like every pass)."""
    with GATE.turn(), torch.no_grad():
        started = time.perf_counter()
        run_with_hooks(cm.model, batch.clean)
        return time.perf_counter() - started


def run_seconds(batches: Sequence[PairBatch], first_pass_s: float, steps: int, curve: bool) -> float:
    """The run's seconds: every batch's tokens at the first batch's seconds a token, times ``passes_a_batch``."""
    if not batches:
        return 0.0
    per_token = first_pass_s / batches[0].clean.numel()
    return per_token * sum(b.clean.numel() for b in batches) * passes_a_batch(steps, curve)


def mean_patching_seconds(resolved: Any, pairs: Sequence[TokenizedPair]) -> tuple[float, float]:
    """(seconds of one calibration pass, seconds of the whole run) for mean patching ``pairs`` on ``resolved``'s
    decoder: one pass of the first pair's batch of copies (``effects.patching.batch_size``) is timed, and every pair
    costs its two runs and a patched copy a head and a residual position (L·H + L·T), batched the same way, each pass
    at the calibration's seconds a token."""
    if not pairs:
        return 0.0, 0.0
    model = resolved.model
    shape = model_shape(model)
    first = pairs[0]
    copies = copies_a_pass(first.n_tokens)
    ids = torch.tensor([first.clean_ids] * copies, dtype=torch.long, device=next(model.parameters()).device)
    with GATE.turn(), torch.no_grad():
        started = time.perf_counter()
        run_with_hooks(model, ids)
        first_s = time.perf_counter() - started
    per_token = first_s / ids.numel()
    total = 0.0
    for pair in pairs:
        tokens = pair.n_tokens
        size = copies_a_pass(tokens)
        patched = shape.n_layers * (shape.n_heads + tokens)
        total += per_token * tokens * (2 + size * math.ceil(patched / size))
    return first_s, total
