"""Activation patching: which heads and which residual positions carry the difference between a clean and a corrupted
prompt to the next-token logits.

The metric is m = logit(answer) − logit(foil) at the last position, and every effect is normalised as
(m_patched − m_corrupt) / (m_clean − m_corrupt): 1 means the patch alone restores the clean answer, 0 that it changes
nothing. *Exact* patching runs the corrupted prompt once per patch, with one activation taken from the clean run:

- a head's output ``z`` (its slice of the output projection's input) at every position, through the hook layer's
  ``blocks.{l}.attn.hook_z``, giving a (layer, head) grid;
- the residual stream entering a layer at one position, through ``blocks.{l}.hook_resid_pre``, giving a (layer, pos)
  grid.

Both go through one ``HookRun`` per pass (``model_core.families.hooks``), this thread's alone. The patched passes
run in batches (copy b of the corrupted prompt carries patch b), with a progress callback and a stop flag; a stopped run
keeps what it computed and marks the rest NaN. *Attribution* patching (Nanda 2023, ``patching_attribution``) estimates
both grids from one forward and one backward pass.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from model_core.effects.patching_inputs import PatchingError, PatchInputs
from model_core.families import Family
from model_core.families.hook_install import open_run
from model_core.families.hooks import HookFn, HookRun
from model_core.gate import GATE
from model_core.models.run_memory import device_of
from model_core.trace.shape import LayerHeadGrid

EQUAL_METRICS = 1e-4
"""How close (in logits) the clean and corrupted metrics may be before nothing can be normalised."""
TOKENS_PER_BATCH = 1024
"""Tokens one patched pass runs at most (copies × prompt length): 51 copies of a 20-token prompt."""
MAX_BATCH = 64

Progress = Callable[[int, int], None]
"""Called with (patched copies run, patched copies to run) after each batch."""
Stop = Callable[[], bool]
"""Returns True to stop: what was computed is kept, the rest stays NaN and the result is marked partial."""


@dataclass(frozen=True, eq=False)
class PatchRuns(LayerHeadGrid):
    """The clean and corrupted runs: their metrics and the activations patching swaps between them.

    Attributes:
        inputs: the checked prompts, answer and foil.
        clean, corrupt: the metric m = logit(answer) − logit(foil) at the last position of each run.

    Shape:
        z_clean, z_corrupt: (layer, pos, head, d_head), each head's output before the output projection.
        resid_clean, resid_corrupt: (layer, pos, d_model), the residual stream entering each layer (resid_pre).
    """

    inputs: PatchInputs
    clean: float
    corrupt: float
    z_clean: torch.Tensor
    z_corrupt: torch.Tensor
    resid_clean: torch.Tensor
    resid_corrupt: torch.Tensor

    @property
    def grid_shape(self) -> tuple[int, int]:
        return self.z_clean.shape[0], self.z_clean.shape[2]  # z: (layer, pos, head, d_head)

    @property
    def denominator(self) -> float:
        """m_clean − m_corrupt: what every effect is divided by."""
        return self.clean - self.corrupt

    def effect(self, metric: np.ndarray | float) -> np.ndarray:
        """(m − m_corrupt) / (m_clean − m_corrupt), elementwise."""
        return (np.asarray(metric, dtype=np.float64) - self.corrupt) / self.denominator


@dataclass(frozen=True, eq=False)
class ExactPatching:
    """Exact patching's effects; NaN where a stopped run did not get to.

    Shape: heads (layer, head); residual (layer, pos) (resid_pre of each layer at each position).
    """

    heads: np.ndarray
    residual: np.ndarray
    partial: bool = False

    @property
    def done(self) -> int:
        """How many patches were computed."""
        return int(np.isfinite(self.heads).sum() + np.isfinite(self.residual).sum())

    @property
    def left(self) -> int:
        """How many patches are not computed yet (NaN): the patched passes resuming it runs."""
        return int(np.isnan(self.heads).sum() + np.isnan(self.residual).sum())


# -- one pass ---------------------------------------------------------------------------------------------------
Edit = Callable[[int, torch.Tensor], "torch.Tensor | None"]
"""Called with (layer, value); a tensor it returns replaces the value (same shape but the batch), None leaves it."""
RESID, Z = "hook_resid_pre", "attn.hook_z"
"""The two points patching reads and writes: the residual stream entering a block, (batch, pos, d_model), and the
heads' outputs before the output projection, (batch, pos, head, d_head)."""


def layer_hooks(point: str, layers: Iterable[int], edit: Edit) -> list[tuple[str, HookFn]]:
    """Hook functions calling ``edit(layer, value)`` at ``blocks.{layer}.{point}`` for each of ``layers``."""
    def hook_for(layer: int) -> HookFn:
        return lambda value, _point: edit(layer, value)
    return [(f"blocks.{layer}.{point}", hook_for(layer)) for layer in layers]


@contextlib.contextmanager
def point_hooks(family: Family, model: Any, hooks: Iterable[tuple[str, HookFn]]) -> Iterator[None]:
    """Apply ``hooks`` (point name, function) to the passes this thread runs in the block, through the hook layer
    (another thread's pass never sees them act)."""
    with open_run(model, family, HookRun(hooks=hooks)):
        yield


def metric_of(family: Family, model: Any, last_hidden: torch.Tensor, inputs: PatchInputs) -> torch.Tensor:
    """logit(answer) − logit(foil) from the last layer's output at the last position, through the final norm, the
    unembedding and any final softcap (``DecoderFamily.unembed``).

    Shape: last_hidden (batch, d_model) -> (batch,).
    """
    logits = family.unembed(model, last_hidden, rows=(inputs.answer_id, inputs.foil_id))
    return (logits[:, 0] - logits[:, 1]).float()


def run_metric(family: Family, model: Any, ids: np.ndarray, inputs: PatchInputs, *, copies: int = 1,
               hidden: bool | str = "last") -> tuple[torch.Tensor, Any]:
    """One pass of ``copies`` copies of ``ids`` through the route (and the hook points of any ``point_hooks``
    around it), and the metric of each copy.

    Returns the metric (copies,) and the route's ``ForwardOutput``.
    """
    dev = device_of(model)
    batch = torch.as_tensor(ids, dtype=torch.long, device=dev)[None].expand(copies, -1).contiguous()
    out = family.forward(model, batch, torch.zeros_like(batch), None, vectors=False, hidden=hidden)
    with torch.inference_mode():
        metric = metric_of(family, model, out.hidden[-1][:, -1], inputs)
    return metric, out


Run = tuple[float, torch.Tensor, torch.Tensor]
"""One prompt's run: its metric, z (layer, pos, head, d_head) and resid_pre (layer, pos, d_model)."""


@torch.no_grad()
def read_run(family: Family, model: Any, ids: np.ndarray, inputs: PatchInputs) -> Run:
    """One pass of a prompt through the route, keeping its metric, every head's ``z`` and every layer's
    ``resid_pre``."""
    z: dict[int, torch.Tensor] = {}

    def keep(layer: int, value: torch.Tensor) -> None:
        z[layer] = value[0].detach().clone()  # (pos, head, d_head)

    with GATE.turn(), point_hooks(family, model, layer_hooks(Z, range(family.n_layers(model.config)), keep)):
        metric, out = run_metric(family, model, ids, inputs, hidden=True)
        resid = torch.stack([h[0] for h in out.hidden[:-1]]).detach().clone()  # (layer, pos, d_model)
        return float(metric[0]), torch.stack([z[i] for i in range(len(z))]), resid


def make_runs(inputs: PatchInputs, clean: Run, corrupt: Run) -> PatchRuns:
    """The two runs together, once their metrics are known to differ.

    Raises:
        PatchingError: the two metrics are equal, so no effect can be normalised.
    """
    if abs(clean[0] - corrupt[0]) < EQUAL_METRICS:
        raise PatchingError(f"The clean and corrupted prompts give the same metric (logit({inputs.answer!r}) − "
                            f"logit({inputs.foil!r}) = {clean[0]:.4f} for both), so no effect can be normalised. "
                            "Choose a corruption that changes the model's answer, or another answer and foil.")
    return PatchRuns(inputs, clean[0], corrupt[0], clean[1], corrupt[1], clean[2], corrupt[2])


def prepare_runs(family: Family, model: Any, inputs: PatchInputs) -> PatchRuns:
    """Run the clean and the corrupted prompt once each, keeping each head's ``z`` and each layer's ``resid_pre``
    (``patching_attribution.runs_and_attribution`` gets the corrupted run from attribution patching's pass instead).

    Raises:
        PatchingError: the two metrics are equal, so no effect can be normalised.
    """
    with GATE.turn():
        clean = read_run(family, model, inputs.clean_ids, inputs)
        corrupt = read_run(family, model, inputs.corrupt_ids, inputs)
    return make_runs(inputs, clean, corrupt)


# -- exact patching -------------------------------------------------------------------------------------------------
Patch = tuple[str, int, int]
"""One patch: ("z", layer, head) or ("resid", layer, position)."""


def all_patches(runs: PatchRuns, *, heads: bool = True, residual: bool = True) -> list[Patch]:
    """Every head, then every (layer, position) of the residual stream."""
    out: list[Patch] = []
    if heads:
        out += [("z", layer, head) for layer in range(runs.n_layers) for head in range(runs.n_heads)]
    if residual:
        out += [("resid", layer, pos) for layer in range(runs.n_layers) for pos in range(runs.inputs.n_tokens)]
    return out


@torch.no_grad()
def _patched_pass(family: Family, model: Any, runs: PatchRuns, patches: list[Patch], source: str) -> torch.Tensor:
    """``patched_metrics`` left on the model's device (no copy to the host). Shape: -> (len(patches),) float32."""
    z_from, resid_from = (runs.z_clean, runs.resid_clean) if source == "clean" else (runs.z_corrupt,
                                                                                     runs.resid_corrupt)
    by_layer: dict[tuple[str, int], tuple[list[int], list[int]]] = {}
    for copy, (kind, layer, index) in enumerate(patches):
        rows, cols = by_layer.setdefault((kind, layer), ([], []))
        rows.append(copy)
        cols.append(index)
    dev = device_of(model)
    index = {key: (torch.tensor(r, device=dev), torch.tensor(c, device=dev)) for key, (r, c) in by_layer.items()}
    first = min(layer for _, layer in by_layer)
    copies = len(patches)
    z_layers = sorted(layer for kind, layer in by_layer if kind == "z")
    resid_layers = sorted({first} | {layer for kind, layer in by_layer if kind == "resid"})

    def edit_z(layer: int, z: torch.Tensor) -> torch.Tensor | None:
        found = index.get(("z", layer))
        if found is None:
            return None
        rows, heads = found
        z = z.clone()
        z[rows, :, heads] = z_from[layer][:, heads].transpose(0, 1).to(z.dtype)  # (k, pos, d_head)
        return z

    def edit_resid(layer: int, resid: torch.Tensor) -> torch.Tensor | None:
        found = index.get(("resid", layer))
        if layer == first:
            resid = resid.expand(copies, -1, -1).clone()  # (copies, pos, d_model): one copy a patch from here on
        elif found is None:
            return None
        else:
            resid = resid.clone()
        if found is not None:
            rows, positions = found
            resid[rows, positions] = resid_from[layer][positions].to(resid.dtype)  # (k, d_model)
        return resid

    hooks = layer_hooks(RESID, resid_layers, edit_resid) + layer_hooks(Z, z_layers, edit_z)
    with GATE.turn(), point_hooks(family, model, hooks):
        metric, _ = run_metric(family, model, runs.inputs.corrupt_ids, runs.inputs)
        if metric.shape[0] != copies:
            raise RuntimeError(f"The patched pass returned {metric.shape[0]} metrics for {copies} patches.")
        return metric


def patched_metrics(family: Family, model: Any, runs: PatchRuns, patches: list[Patch], *,
                    source: str = "clean", on_device: bool = False) -> np.ndarray | torch.Tensor:
    """The corrupted run's metric with each patch's activation taken from the ``source`` run, one copy per patch,
    all in one pass (the caller batches).

    The blocks before the earliest patched layer are the same for every copy, so the pass runs them once, on one copy
    of the corrupted prompt, and a pre-hook on that layer's block repeats its input for the copies (the route's masks
    and rotary tables, made for one copy, broadcast). A patch late in the model costs its last layers only.

    Args:
        patches: ("z", layer, head) or ("resid", layer, position), one per copy.
        source: "clean" (patching), or "corrupt" (the corrupted run's own values: nothing may change).
        on_device: return the metrics as a float32 tensor left on the model's device (a caller that gathers many
            batches copies them to the host once).

    Shape: -> (len(patches),) float64 (float32 on the device).
    """
    metric = _patched_pass(family, model, runs, patches, source)
    return metric if on_device else metric.double().cpu().numpy()


def unchanged_patches(runs: PatchRuns, patches: list[Patch]) -> np.ndarray:
    """``unchanged`` for every patch, compared on the device at once, copied once. Shape: -> (len(patches),) bool."""
    same_z = (runs.z_clean == runs.z_corrupt).all(dim=3).all(dim=1)  # (layer, head)
    same_resid = (runs.resid_clean == runs.resid_corrupt).all(dim=2)  # (layer, pos)
    same = torch.cat([same_z.reshape(-1), same_resid.reshape(-1)]).cpu().numpy()
    n_z = same_z.numel()
    n_heads, n_pos = same_z.shape[1], same_resid.shape[1]
    return np.array([same[layer * n_heads + index] if kind == "z" else same[n_z + layer * n_pos + index]
                     for kind, layer, index in patches], dtype=bool).reshape(len(patches))


def unchanged(runs: PatchRuns, patch: Patch) -> bool:
    """Whether the patch swaps in values equal to the corrupted run's own (a residual position before the first
    token that differs: a causal model's prefix is the same in both runs), so the patched run is the corrupted run
    and its effect is exactly 0 without a pass."""
    return bool(unchanged_patches(runs, [patch])[0])


def passes_needed(runs: PatchRuns, *, heads: bool = True, residual: bool = True) -> int:
    """How many patched copies exact patching runs (the patches that are not ``unchanged``)."""
    patches = all_patches(runs, heads=heads, residual=residual)
    return int((~unchanged_patches(runs, patches)).sum())


def batch_size(n_tokens: int) -> int:
    """Copies of the prompt one patched pass runs (``TOKENS_PER_BATCH`` tokens, at most ``MAX_BATCH`` copies)."""
    return int(max(1, min(MAX_BATCH, TOKENS_PER_BATCH // max(n_tokens, 1))))


def exact_patching(family: Family, model: Any, runs: PatchRuns, *, heads: bool = True, residual: bool = True,
                   progress: Progress | None = None, stop: Stop | None = None, batch: int | None = None,
                   keep: Callable[[ExactPatching], None] | None = None,
                   resume: ExactPatching | None = None) -> ExactPatching:
    """Patch every head's ``z`` and every (layer, position) of ``resid_pre`` from the clean run into the corrupted
    run, one at a time, in batches.

    A patch that swaps in the corrupted run's own values (a residual position before the first differing token) has
    effect 0 without a pass. The patched metrics stay on the model's device and come to the host once at the end
    (or after each batch for ``keep``, which asks for the result so far).

    Args:
        heads, residual: which grids to compute (the one left out stays NaN).
        progress: called with (patched passes done, patched passes in all) after each batch.
        stop: asked before each batch; True keeps what was computed and marks the result partial.
        batch: copies per pass (default ``batch_size(n_tokens)``).
        keep: called after each batch with the result so far (marked partial until the last batch), so a caller
            whose run may be cut short (a Streamlit rerun) keeps what was computed.
        resume: a partial result of the same runs and grids: its finite effects are kept and only the rest (NaN)
            is patched; ``progress`` counts them as done.

    Raises:
        ValueError: ``resume`` has other grid shapes than these runs'.

    Shape: -> heads (layer, head), residual (layer, pos).
    """
    patches = all_patches(runs, heads=heads, residual=residual)
    size = batch or batch_size(runs.inputs.n_tokens)
    effects = np.full(len(patches), np.nan)
    same = unchanged_patches(runs, patches)
    effects[same] = 0.0
    if resume is not None:
        effects = _resumed(runs, resume, effects, heads, residual)
    todo = np.flatnonzero(np.isnan(effects))
    already = int((~same & ~np.isnan(effects)).sum())  # patched passes the resumed run had done
    n_heads = runs.n_layers * runs.n_heads if heads else 0
    metrics = torch.full((len(todo),), float("nan"), device=device_of(model))  # patched metrics, on the device
    copied = 0  # how many of ``metrics`` are in ``effects`` already

    def to_effects(upto: int) -> None:  # the metrics not copied yet, in one copy
        nonlocal copied
        if upto > copied:
            effects[todo[copied:upto]] = runs.effect(metrics[copied:upto].double().cpu().numpy())
            copied = upto

    for start in range(0, len(todo), size):
        if stop is not None and stop():
            to_effects(start)
            return _grids(runs, effects, n_heads, heads, residual, partial=True)
        chunk = todo[start:start + size]
        metrics[start:start + len(chunk)] = patched_metrics(family, model, runs, [patches[i] for i in chunk],
                                                            on_device=True)
        if keep is not None:
            to_effects(start + len(chunk))
            keep(_grids(runs, effects, n_heads, heads, residual, partial=start + size < len(todo)))
        if progress is not None:
            progress(already + start + len(chunk), already + len(todo))
    to_effects(len(todo))
    return _grids(runs, effects, n_heads, heads, residual, partial=False)


def _resumed(runs: PatchRuns, resume: ExactPatching, effects: np.ndarray, heads: bool,
             residual: bool) -> np.ndarray:
    """``effects`` (flat, heads first) with a partial result's finite effects filled in."""
    shapes = ((runs.n_layers, runs.n_heads), (runs.n_layers, runs.inputs.n_tokens))
    if (resume.heads.shape, resume.residual.shape) != shapes:
        raise ValueError(f"The result to resume has grids {resume.heads.shape} and {resume.residual.shape}, but "
                         f"these runs have {shapes[0]} and {shapes[1]}: resume a result of the same prompts and model.")
    done = np.concatenate([resume.heads.ravel() if heads else [], resume.residual.ravel() if residual else []])
    out = effects.copy()
    known = np.isfinite(done)
    out[known] = done[known]
    return out


def _grids(runs: PatchRuns, effects: np.ndarray, n_heads: int, heads: bool, residual: bool, *,
           partial: bool) -> ExactPatching:
    """The flat effects (heads first, then the residual stream) as grids."""
    head_grid = np.full((runs.n_layers, runs.n_heads), np.nan)
    resid_grid = np.full((runs.n_layers, runs.inputs.n_tokens), np.nan)
    if heads:
        head_grid = effects[:n_heads].reshape(runs.n_layers, runs.n_heads).copy()
    if residual:
        resid_grid = effects[n_heads:].reshape(runs.n_layers, runs.inputs.n_tokens).copy()
    return ExactPatching(head_grid, resid_grid, partial=partial)
