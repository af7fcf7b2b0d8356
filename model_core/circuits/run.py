"""The circuit pipeline: a dataset -> its pairs checked against the tokenizer -> batches of one token count -> edge
scores (EAP or EAP-IG, locally or on Ray) -> the faithfulness curve -> a ``CircuitResult``.

A progress callback hears the share done; a stop flag, asked before each batch, ends the run keeping the batches
finished (the result is marked partial, with no curve); ``keep`` hears the result so far after each batch (a
Streamlit run cut short by a click keeps it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from model_core.circuits.budget import fitted_batches
from model_core.circuits.datasets import (
    Dataset,
    Pair,
    Validated,
    load_dataset,
    validate,
)
from model_core.circuits.eap import (
    DEFAULT_STEPS,
    BatchScores,
    CircuitModel,
    DeviceScores,
    PairBatch,
    default_batch,
    score_batch_on_device,
)
from model_core.circuits.evaluate import Stop, faithfulness_curve
from model_core.circuits.faithfulness import FRACTIONS
from model_core.circuits.graph import EdgeScores
from model_core.circuits.loading import load_circuit_model
from model_core.circuits.result import METHODS, CircuitResult
from model_core.models.run_memory import device_of, run_memory_limit_mb

Progress = Callable[[float, str], None]
"""Called with (share of the whole run done, 0..1; what is running)."""
ENGINES = ("local", "ray")


def method_steps(method: str, steps: int | None) -> int:
    """The gradient's points along the path: 1 for EAP, ``steps`` (default 5) for EAP-IG.

    Raises:
        ValueError: an unknown method, or steps below 1.
    """
    if method not in METHODS:
        raise ValueError(f"The method is one of {', '.join(METHODS)}, not {method!r}.")
    if method == "eap":
        return 1
    steps = DEFAULT_STEPS if steps is None else steps
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"--steps is a whole number ≥ 1, not {steps!r}.")
    return int(steps)


class Totals:
    """Sums over the batches done: of the per-pair edge scores and of the clean and corrupted metrics. A local run's
    sums stay on the model's device (``DeviceScores``) and come to the host once, when a result is asked for."""

    def __init__(self, shape: tuple[int, int]) -> None:
        self.score_sum: np.ndarray | torch.Tensor = np.zeros(shape, dtype=np.float64)
        self.clean_sum: float | torch.Tensor = 0.0
        self.corrupt_sum: float | torch.Tensor = 0.0
        self.n = 0

    def add(self, got: BatchScores | DeviceScores) -> None:
        if isinstance(got, DeviceScores) and isinstance(self.score_sum, np.ndarray) and not self.n:
            self.score_sum = torch.zeros_like(got.score_sum)  # the first batch: sum on its device from now on
        if isinstance(self.score_sum, torch.Tensor) and isinstance(got, BatchScores):
            got = DeviceScores(torch.from_numpy(got.score_sum).to(self.score_sum), torch.from_numpy(got.clean),
                               torch.from_numpy(got.corrupt), got.rows)
        self.score_sum += got.score_sum
        self.clean_sum += got.clean.sum()
        self.corrupt_sum += got.corrupt.sum()
        self.n += len(got)

    def result(self, cm: CircuitModel, method: str, steps: int, problems: Sequence[str], *,
               partial: bool) -> CircuitResult:
        n = max(self.n, 1)
        score_sum, clean_sum, corrupt_sum = self.score_sum, self.clean_sum, self.corrupt_sum
        if isinstance(score_sum, torch.Tensor):  # one copy of the scores, one of the two metric sums
            score_sum = score_sum.cpu().double().numpy()
            clean_sum, corrupt_sum = torch.stack([torch.as_tensor(clean_sum), torch.as_tensor(corrupt_sum)]
                                                 ).cpu().double().numpy()
        scores = EdgeScores(cm.graph, score_sum / n)
        nan = float("nan")
        return CircuitResult(self.n, float(clean_sum) / n if self.n else nan,
                             float(corrupt_sum) / n if self.n else nan, method, steps, scores, None, tuple(problems),
                             partial)


def _passes(steps: int, curve: bool, n_fractions: int) -> tuple[float, float]:
    """The run's two parts' weights, in passes a pair: scores (two sender runs, m forward and backward passes), the
    curve (a corrupted and a clean run, one patched pass a fraction)."""
    return 2.0 + 3.0 * steps, (2.0 + n_fractions) if curve else 0.0


def run_circuit(cm: CircuitModel, dataset: Dataset | Sequence[Pair], *, method: str = "eap-ig",
                steps: int | None = None, batch_size: int | None = None, curve: bool = True,
                engine: str = "local", model_id: str | None = None, num_cpus: int | None = None,
                ray_address: str | None = None, progress: Progress | None = None, stop: Stop | None = None,
                keep: Callable[[CircuitResult], None] | None = None,
                run_memory_mb: float | None = None) -> CircuitResult:
    """Edge attribution of every valid pair of ``dataset`` on ``cm``'s model, and its faithfulness curve.

    Args:
        method: "eap" (one gradient, on the clean run) or "eap-ig" (``steps`` points along the path, default 5).
        batch_size: pairs a pass (pairs of one token count only); default ``default_batch``: 16 on a CPU, 64 on a
            GPU (16 with the Ray engine, whose workers run on CPUs).
        curve: also compute the faithfulness curve at ``FRACTIONS`` (always locally).
        engine: "local", or "ray": the batches go to Ray workers that load ``model_id`` themselves, and their
            per-pair sums are combined into the same mean.
        progress, stop, keep: see the module docstring.
        run_memory_mb: the memory one batch may take (default ``AE_RUN_MEMORY_MB``): a batch of long pairs holds
            fewer pairs, and a pair that does not fit alone is skipped with a problem (``circuits.budget``).

    Raises:
        DatasetError: no pair is valid (the message lists the problems).
        RunMemoryError: no valid pair fits the memory limit (the message names the estimate and the limit).
        ValueError: a bad method, steps, batch size or engine.
    """
    if engine not in ENGINES:
        raise ValueError(f"The engine is one of {', '.join(ENGINES)}, not {engine!r}.")
    steps = method_steps(method, steps)
    checked: Validated = validate(dataset, cm.tokenizer).require()
    batch_size = default_batch(cm.model, engine) if batch_size is None else batch_size
    limit_mb = run_memory_limit_mb(override_mb=run_memory_mb, device=device_of(cm.model))
    fitted = fitted_batches(cm, checked.pairs, batch_size, limit_mb=limit_mb,
                            curve=curve)
    problems = sorted([*checked.messages, *fitted.problems], key=_row_of)
    batches = fitted.batches
    totals = Totals(cm.graph.shape)
    n_total = sum(len(b) for b in batches)
    w_scores, w_curve = _passes(steps, curve, len(FRACTIONS))
    share = w_scores / (w_scores + w_curve)

    def told(fraction: float, text: str) -> None:
        if progress is not None:
            progress(min(1.0, max(0.0, fraction)), text)

    told(0.0, f"Edge scores: 0 of {n_total} pairs")
    stopped = False
    if engine == "ray":
        from model_core.circuits.ray_engine import (
            score_on_ray,  # optional engine: Ray takes seconds to import
        )
        for got in score_on_ray(model_id, batches, steps, address=ray_address, num_cpus=num_cpus):
            totals.add(got)
            told(share * totals.n / n_total, f"Edge scores: {totals.n} of {n_total} pairs (Ray)")
            if keep is not None and totals.n < n_total:
                keep(totals.result(cm, method, steps, problems, partial=True))
            if stop is not None and stop():
                stopped = True
                break
    else:
        for batch in batches:
            if stop is not None and stop():
                stopped = True
                break
            totals.add(score_batch_on_device(cm, batch, steps))
            told(share * totals.n / n_total, f"Edge scores: {totals.n} of {n_total} pairs")
            if keep is not None and totals.n < n_total:
                keep(totals.result(cm, method, steps, problems, partial=True))
    result = totals.result(cm, method, steps, problems, partial=stopped)
    if stopped or not curve or totals.n == 0:
        if keep is not None:
            keep(result)
        told(1.0, "Stopped" if stopped else "Done")
        return result
    if keep is not None:  # the scores are done: a click during the curve keeps them
        keep(CircuitResult(result.n, result.clean, result.corrupt, method, steps, result.scores, None,
                           result.problems, True))
    done_batches = _done(batches, totals.n)
    try:
        found = faithfulness_curve(cm, done_batches, result.scores, progress=lambda f: told(
            share + (1 - share) * f, "Faithfulness curve"), stop=stop)
    except ValueError as exc:  # equal clean and corrupted means: nothing to normalise
        problems.append(f"faithfulness: {exc}")
        found = None
    final = CircuitResult(result.n, result.clean, result.corrupt, method, steps, result.scores, found,
                          tuple(problems), found is None and stop is not None and stop())
    if keep is not None:
        keep(final)
    told(1.0, "Done")
    return final


def _row_of(problem: str) -> int:
    """A problem line's row ("pair 3 (row 3): ..."), to list them in row order."""
    try:
        return int(problem.split()[1])
    except (IndexError, ValueError):
        return 0


def _done(batches: list[PairBatch], n: int) -> list[PairBatch]:
    """The first batches holding ``n`` pairs (the ones scored)."""
    out, count = [], 0
    for batch in batches:
        if count >= n:
            break
        out.append(batch)
        count += len(batch)
    return out


def circuit(source: str | Dataset | Sequence[Pair], *, model_id: str | None = None, method: str = "eap-ig",
            steps: int | None = None, batch_size: int | None = None, curve: bool = True, engine: str = "local",
            device: str | torch.device | None = None, num_cpus: int | None = None, ray_address: str | None = None,
            progress: Progress | None = None, stop: Stop | None = None,
            run_memory_mb: float | None = None) -> CircuitResult:
    """Edge attribution from scratch: ``source`` is a JSONL or CSV file, a generator spec (``ioi:64:0``), a
    ``Dataset`` or a list of pairs; the model a pretrained decoder id.

    Raises:
        DatasetError, CircuitModelError, ModelLoadError, ValueError: see ``run_circuit``.
    """
    dataset = load_dataset(source) if isinstance(source, str) else source
    cm = load_circuit_model(model_id, device=device)
    return run_circuit(cm, dataset, method=method, steps=steps, batch_size=batch_size, curve=curve, engine=engine,
                       model_id=model_id, num_cpus=num_cpus, ray_address=ray_address, progress=progress, stop=stop,
                       run_memory_mb=run_memory_mb)
