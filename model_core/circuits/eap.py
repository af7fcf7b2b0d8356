"""Edge attribution patching over a dataset: EAP (Syed et al., 2023) and EAP-IG (Hanna et al., 2024).

For a pair, Δ_u = z_u^clean − z_u^corrupt is each sender's output difference (``input``: ``blocks.0.hook_resid_pre``;
a head: its write ``attn.hook_result``; an MLP: ``hook_mlp_out``) at every position, and g_v = (1/m) Σ_{k=1..m} ∂M/∂x_v
the receiver's input gradient (each query head's own q, k, v input ``hook_*_input``, the MLP's own input
``hook_mlp_in``, the last ``hook_resid_post`` for ``logits``) on the run whose input embeddings are
e_corrupt + (k/m)(e_clean − e_corrupt); M = logit(answer) − logit(foil) at the last position. The gradient flows through
every norm as the model computes it. score(u → v) = Σ_positions Δ_u · g_v, summed here over the pairs of a batch (the
caller divides by the pairs run: a mean of per-pair sums).

A batch holds pairs of one token count, so no padding and no moved positions: each pair's scores equal running it
alone (up to float rounding). Scores are dense GEMMs over stacked tensors, one per group of receivers that read the
same senders (``Graph.upstream``), never a loop over edges:

    Δ (n_senders, batch·pos·d_model) @ G (n_receivers, batch·pos·d_model)ᵀ -> (n_senders, n_receivers)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from model_core.circuits.datasets import TokenizedPair
from model_core.circuits.graph import Graph
from model_core.families import family_of
from model_core.families.hooked import run_with_hooks
from model_core.gate import GATE
from model_core.kernel import on_device

DEFAULT_STEPS = 5
DEFAULT_BATCH = 16
"""Pairs a pass on a CPU, where a pass costs its arithmetic, so more pairs a batch cost as much a pair (SmolLM2,
EAP-IG(5) with the curve on 32 IOI pairs: 72.0 s in batches of 16, 72.5 s in one of 32; 29 Nov)."""
GPU_BATCH = 64
"""Pairs a pass on a GPU, where a small model's pass is mostly its kernel launches, one an op: the same 32 pairs made
230,197 aten ops in batches of 16 and 116,293 in one of 32. ``circuits.budget`` makes a batch smaller where its
estimate does not fit the run's memory."""


def default_batch(model: Any, engine: str = "local") -> int:
    """Pairs a pass: ``GPU_BATCH`` where ``model`` is on a GPU, ``DEFAULT_BATCH`` on a CPU, and with the Ray engine,
    whose workers load their own model on the CPU (``circuits.ray_engine``)."""
    on_cpu = engine == "ray" or next(model.parameters()).device.type == "cpu"
    return DEFAULT_BATCH if on_cpu else GPU_BATCH


class CircuitModelError(ValueError):
    """A model this engine cannot attribute edges in; the message says which to use."""


@dataclass(frozen=True, eq=False)
class CircuitModel:
    """A decoder ready for edge attribution: the model, its tokenizer, and its graph.

    Attributes:
        model: a transformers decoder loaded through ``model_core.models.loading`` (frozen weights).
        tokenizer: its tokenizer. graph: its nodes and edges. d_model: the residual stream's width.
    """

    model: Any
    tokenizer: Any
    graph: Graph
    d_model: int

    @property
    def n_layers(self) -> int:
        return self.graph.n_layers

    @property
    def dtype(self) -> torch.dtype:
        """The stacks' dtype: the model's own, at least float32 (a float64 model keeps float64)."""
        return torch.promote_types(next(self.model.parameters()).dtype, torch.float32)

    @property
    def device(self) -> torch.device:
        """Where the model is: the stacks, the gradients and the sums stay there until a run returns."""
        return next(self.model.parameters()).device

    @property
    def n_heads(self) -> int:
        return self.graph.n_heads


def circuit_model(model: Any, tokenizer: Any) -> CircuitModel:
    """Check that ``model`` is a decoder whose residual stream is a sum of its senders' writes, and build its graph.

    Raises:
        CircuitModelError: an encoder (no next token), a post-norm block (Gemma 2/3: a head's write passes through a
            norm before the sum, so it is no sender output), or a parallel block (Phi-1/2: the MLP has no input of
            its own before the norm it shares with attention).
    """
    family = family_of(model)
    if not family.is_decoder:
        raise CircuitModelError(f"Edge attribution compares next-token logits, and a {family.label} predicts no next "
                                "token: use a decoder (e.g. bundled:SmolLM2-135M-Instruct).")
    config = model.config
    n_layers, n_heads = family.n_layers(config), family.n_heads(config)
    parts = family.parts(model, 0)
    if parts.post_norm or parts.attn_post_norm is not None or parts.mlp_post_norm is not None:
        raise CircuitModelError("This model normalises each sublayer's output before adding it to the residual "
                                "stream (Gemma 2/3), so a head's write is not a sender output the graph can subtract: "
                                "use a pre-norm decoder such as SmolLM2, Llama, Qwen or GPT-2.")
    if parts.parallel:
        raise CircuitModelError("Attention and MLP share one normed input in this model (Phi-1/2), so the MLP has no "
                                "input of its own to patch: use a sequential decoder such as SmolLM2, Llama, Qwen or "
                                "GPT-2.")
    return CircuitModel(model, tokenizer, Graph(n_layers, n_heads), int(config.hidden_size))


# -- batches ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class PairBatch:
    """Pairs of one token count, stacked.

    Shape: clean, corrupt (batch, pos) int64; answer, foil (batch,) int64. rows: each pair's row in its dataset.
    """

    clean: torch.Tensor
    corrupt: torch.Tensor
    answer: torch.Tensor
    foil: torch.Tensor
    rows: tuple[int, ...]

    def __len__(self) -> int:
        """How many pairs."""
        return int(self.clean.shape[0])

    def to(self, device: torch.device) -> PairBatch:
        """The batch on ``device`` (itself when it is there already): moved once, not in every pass."""
        if self.clean.device == torch.device(device):
            return self
        return PairBatch(self.clean.to(device), self.corrupt.to(device), self.answer.to(device),
                         self.foil.to(device), self.rows)


def make_batches(pairs: Sequence[TokenizedPair], batch_size: int = DEFAULT_BATCH) -> list[PairBatch]:
    """Group pairs by token count (first seen first, dataset order within a count) into batches of at most
    ``batch_size``: no padding, so every position is its own (rotary positions never shift).

    Raises:
        ValueError: a batch size below 1.
    """
    if isinstance(batch_size, bool) or int(batch_size) < 1:
        raise ValueError(f"The batch size is a whole number ≥ 1, not {batch_size!r}.")
    groups: dict[int, list[TokenizedPair]] = {}
    for pair in pairs:
        groups.setdefault(pair.n_tokens, []).append(pair)
    batches = []
    for group in groups.values():
        for start in range(0, len(group), int(batch_size)):
            chunk = group[start:start + int(batch_size)]
            batches.append(PairBatch(torch.tensor([p.clean_ids for p in chunk], dtype=torch.long),
                                     torch.tensor([p.corrupt_ids for p in chunk], dtype=torch.long),
                                     torch.tensor([p.answer_id for p in chunk], dtype=torch.long),
                                     torch.tensor([p.foil_id for p in chunk], dtype=torch.long),
                                     tuple(p.row for p in chunk)))
    return batches


# -- points ----------------------------------------------------------------------------------------------------------
def sender_points(n_layers: int) -> list[str]:
    """The hook point of every sender's output, in pass order."""
    points = ["blocks.0.hook_resid_pre"]
    for layer in range(n_layers):
        points += [f"blocks.{layer}.attn.hook_result", f"blocks.{layer}.hook_mlp_out"]
    return points


def receiver_points(n_layers: int) -> list[str]:
    """The hook point of every receiver's input, in pass order (``logits``: the last block's output, the final
    norm's input)."""
    points = []
    for layer in range(n_layers):
        points += [f"blocks.{layer}.hook_q_input", f"blocks.{layer}.hook_k_input", f"blocks.{layer}.hook_v_input",
                   f"blocks.{layer}.hook_mlp_in"]
    return points + [f"blocks.{n_layers - 1}.hook_resid_post"]


def sender_rows(graph: Graph, point: str) -> slice:
    """The rows of the sender stack a sender point fills."""
    if point == "blocks.0.hook_resid_pre":
        return slice(0, 1)
    layer = int(point.split(".")[1])
    first = graph.head_sender(layer, 0)
    return slice(first, first + graph.n_heads) if point.endswith("hook_result") else slice(first + graph.n_heads,
                                                                                           first + graph.n_heads + 1)


def receiver_rows(graph: Graph, point: str) -> slice:
    """The receivers a receiver point feeds: a stride-3 slice for a head input (q, k or v of every head)."""
    if point.endswith("hook_resid_post"):
        return slice(graph.logits_receiver, graph.logits_receiver + 1)
    layer = int(point.split(".")[1])
    if point.endswith("hook_mlp_in"):
        r = graph.mlp_receiver(layer)
        return slice(r, r + 1)
    part = point.split(".")[-1][len("hook_"):-len("_input")]
    first = graph.head_receiver(layer, 0, part)
    return slice(first, first + 3 * graph.n_heads, 3)


def as_rows(t: torch.Tensor) -> torch.Tensor:
    """A point's value as one row per node: (batch, pos, head, d_model) -> (head, batch·pos·d_model);
    (batch, pos, d_model) -> (1, batch·pos·d_model)."""
    if t.dim() == 4:
        return t.permute(2, 0, 1, 3).reshape(t.shape[2], -1)
    return t.reshape(1, -1)


def from_rows(rows: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The inverse of ``as_rows``: rows shaped as ``like``."""
    if like.dim() == 4:
        b, p, h, d = like.shape
        return rows.reshape(h, b, p, d).permute(1, 2, 0, 3)
    return rows.reshape(like.shape)


def own_copy(t: torch.Tensor, _point: Any) -> torch.Tensor:
    """A hook that hands a receiver point a copy of its own: the hook layer passes ``hook_mlp_in``'s tensor to the
    MLP's norm, but the block also adds that same tensor to the residual stream, so a gradient kept on it would
    count the skip connection too. The copy goes to the MLP alone."""
    return t.clone()


def receiver_hooks(n_layers: int, fn: Callable[[torch.Tensor, Any], torch.Tensor] = own_copy
                   ) -> list[tuple[str, Callable]]:
    """``fn`` on every MLP input (``own_copy`` by default: see there)."""
    return [(f"blocks.{layer}.hook_mlp_in", fn) for layer in range(n_layers)]


def metric(logits: torch.Tensor, answer: torch.Tensor, foil: torch.Tensor) -> torch.Tensor:
    """M = logit(answer) − logit(foil) at the last position. Shape: logits (batch, pos, vocab) -> (batch,)."""
    last = logits[:, -1, :]
    rows = torch.arange(last.shape[0], device=last.device)
    return last[rows, on_device(answer, last.device)] - last[rows, on_device(foil, last.device)]


# -- the clean and corrupted runs ------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class SenderRun:
    """One run's sender outputs, stacked, its input embeddings and its metric.

    Shape: senders (n_senders, batch·pos·d_model), ``CircuitModel.dtype``; embed (batch, pos, d_model); metric (batch,).
    """

    senders: torch.Tensor
    embed: torch.Tensor
    metric: torch.Tensor


def sender_run(cm: CircuitModel, ids: torch.Tensor, batch: PairBatch,
               hooks: Sequence[tuple[str, Callable]] = ()) -> SenderRun:
    """Run ``ids`` recording every sender's output into one stack on the model's device (no gradients)."""
    graph = cm.graph
    n = ids.numel() * cm.d_model
    stack = torch.empty(len(graph.senders), n, dtype=cm.dtype, device=cm.device)

    def keep(t: torch.Tensor, point: Any) -> None:
        stack[sender_rows(graph, point.name)] = as_rows(t.detach())  # copy_ casts to the stack's dtype in place
    out = run_with_hooks(cm.model, ids, names=["hook_embed"], hooks=[*hooks, *((p, keep) for p in
                                                                                 sender_points(cm.n_layers))])
    return SenderRun(stack, out.cache["hook_embed"].detach(),
                     metric(out.logits, batch.answer, batch.foil).detach().to(dtype=cm.dtype))


# -- gradients -------------------------------------------------------------------------------------------------------
def receiver_gradients(cm: CircuitModel, batch: PairBatch, e_clean: torch.Tensor, e_corrupt: torch.Tensor,
                       steps: int) -> torch.Tensor:
    """g_v = (1/m) Σ_{k=1..m} ∂(Σ_pairs M)/∂x_v, the input embeddings at e_corrupt + (k/m)(e_clean − e_corrupt).

    Shape: -> (n_receivers, batch·pos·d_model), ``cm.dtype``, on the model's device.
    """
    graph = cm.graph
    points = receiver_points(cm.n_layers)
    total = torch.zeros(len(graph.receivers), batch.clean.numel() * cm.d_model, dtype=cm.dtype, device=cm.device)
    for k in range(1, steps + 1):
        alpha = k / steps

        def embed(t: torch.Tensor, _point: Any, alpha: float = alpha) -> torch.Tensor:
            # A leaf of its own, so the pass is differentiable whatever the embedding module gave
            path = e_corrupt + alpha * (e_clean - e_corrupt) if alpha != 1.0 else e_clean.clone()
            return path.to(dtype=t.dtype).requires_grad_(True)  # the embeddings are on the model's device already
        out = run_with_hooks(cm.model, batch.clean, names=points,
                             hooks=[("hook_embed", embed), *receiver_hooks(cm.n_layers)], grad=True)
        metric(out.logits, batch.answer, batch.foil).sum().backward()
        for point in points:
            grad = out.cache[point].grad
            if grad is not None:  # a receiver the metric does not reach keeps a zero gradient
                total[receiver_rows(graph, point)] += as_rows(grad).to(dtype=cm.dtype)
        del out
    return total / steps


def upstream_groups(graph: Graph) -> Iterator[tuple[int, int, int]]:
    """(first receiver, end, senders read) for each run of consecutive receivers that read the same senders."""
    up = graph.upstream
    start = 0
    while start < len(up):
        end = start
        while end < len(up) and up[end] == up[start]:
            end += 1
        yield start, end, int(up[start])
        start = end


def sum_dtype(device: torch.device) -> torch.dtype:
    """The dtype sums over pairs and batches are kept in on ``device``: float64, where the device has it (not MPS)."""
    return torch.float32 if torch.device(device).type == "mps" else torch.float64


def edge_products(graph: Graph, delta: torch.Tensor, grads: torch.Tensor) -> torch.Tensor:
    """Σ over the stacked (pair, position, d_model) axis of Δ_u · g_v for every edge; 0 off the edges. On the
    stacks' device.

    Shape: delta (n_senders, N), grads (n_receivers, N) -> (n_senders, n_receivers) float64.
    """
    out = torch.zeros(graph.shape, dtype=sum_dtype(delta.device), device=delta.device)
    for start, end, up in upstream_groups(graph):
        out[:up, start:end] = delta[:up] @ grads[start:end].T
    return out


# -- a batch's scores ------------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class BatchScores:
    """Sums over a batch's pairs: of the per-pair edge scores, and of M on the clean and the corrupted prompts.

    Shape: score_sum (n_senders, n_receivers) float64; clean, corrupt (batch,) per-pair metrics.
    """

    score_sum: np.ndarray
    clean: np.ndarray
    corrupt: np.ndarray
    rows: tuple[int, ...]

    def __len__(self) -> int:
        """How many pairs."""
        return len(self.rows)


@dataclass(frozen=True, eq=False)
class DeviceScores:
    """``BatchScores`` still on the model's device: what a run adds up before it copies to the host once.

    Shape: score_sum (n_senders, n_receivers); clean, corrupt (batch,); ``sum_dtype`` of the device.
    """

    score_sum: torch.Tensor
    clean: torch.Tensor
    corrupt: torch.Tensor
    rows: tuple[int, ...]

    def __len__(self) -> int:
        """How many pairs."""
        return len(self.rows)

    def host(self) -> BatchScores:
        """The scores on the host, float64 (three copies)."""
        return BatchScores(self.score_sum.cpu().double().numpy(), self.clean.cpu().double().numpy(),
                           self.corrupt.cpu().double().numpy(), self.rows)


def score_batch_on_device(cm: CircuitModel, batch: PairBatch, steps: int = DEFAULT_STEPS) -> DeviceScores:
    """``score_batch`` with its sums left on the model's device (no copy to the host).

    Raises:
        ValueError: steps below 1.
    """
    if isinstance(steps, bool) or int(steps) < 1:
        raise ValueError(f"steps is a whole number ≥ 1, not {steps!r}.")
    batch = batch.to(cm.device)
    with GATE.turn():  # the forward passes take their own turns; the backward passes run inside this one
        clean = sender_run(cm, batch.clean, batch)
        corrupt = sender_run(cm, batch.corrupt, batch)
        delta = clean.senders.sub_(corrupt.senders)  # (n_senders, N): Δ_u, in place
        grads = receiver_gradients(cm, batch, clean.embed, corrupt.embed, int(steps))
    scores = edge_products(cm.graph, delta, grads)
    return DeviceScores(scores, clean.metric.to(scores.dtype), corrupt.metric.to(scores.dtype), batch.rows)


def score_batch(cm: CircuitModel, batch: PairBatch, steps: int = DEFAULT_STEPS) -> BatchScores:
    """EAP-IG (EAP with ``steps`` 1) on one batch: Σ over its pairs of Σ_positions Δ_u · g_v for every edge.

    Raises:
        ValueError: steps below 1.
    """
    return score_batch_on_device(cm, batch, steps).host()
