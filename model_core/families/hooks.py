"""Named hook points, in TransformerLens's names, for every family: one way into the model.

One mechanism reads the points (a cache by name), writes them (a hook function that returns a replacement; ``patch``
and ``add`` build the usual ones, at chosen positions) and takes gradients at them (``grad=True``: every cached
tensor keeps its ``.grad`` after a backward pass). It works per thread: the module hooks are installed once per
model (``install_hook_points``) and act only for the thread whose pass opened a ``HookRun`` (sessions sharing one
cached model never see each other's hooks), and every pass holds a turn of the route's gate.

| point | shape | where |
|---|---|---|
| ``hook_embed`` / ``hook_pos_embed`` / ``hook_token_type_embed`` | (batch, pos, d_model) | the token / learned position / segment embedding's output |
| ``blocks.{l}.hook_resid_pre`` | (batch, pos, d_model) | block l's input |
| ``blocks.{l}.hook_resid_mid`` | (batch, pos, d_model) | after attention is added (post-LN: the sum before the LayerNorm); no point in a parallel block (Phi-1/2) |
| ``blocks.{l}.hook_resid_post`` | (batch, pos, d_model) | block l's output (post-LN: after the LayerNorm) |
| ``blocks.{l}.attn.hook_q`` | (batch, pos, head, d_head) | after the rotary embedding (and any per-head norm) |
| ``blocks.{l}.attn.hook_k`` / ``hook_v`` | (batch, pos, kv_head, d_head) | per key/value head; with split inputs per query head |
| ``blocks.{l}.attn.hook_pattern`` | (batch, head, q_pos, k_pos) | the softmax weights |
| ``blocks.{l}.attn.hook_z`` | (batch, pos, head, d_head) | the heads' outputs, the output projection's input (a head switched off by a trace's head mask is zero here already) |
| ``blocks.{l}.attn.hook_result`` | (batch, pos, head, d_model) | each head's write, z through its slice of W_O (read only, computed only when asked for) |
| ``blocks.{l}.hook_q_input`` / ``hook_k_input`` / ``hook_v_input`` | (batch, pos, head, d_model) | each query head's own copy of resid_pre, before the norm (split inputs) |
| ``blocks.{l}.hook_attn_out`` | (batch, pos, d_model) | what attention adds to the residual stream (Gemma 2/3: after its post-norm) |
| ``blocks.{l}.hook_mlp_in`` / ``hook_mlp_out`` | (batch, pos, d_model) | the MLP's own copy of the residual stream before its norm (post-LN: the MLP's input; Phi-1/2: the normed input it shares with attention) / what the MLP adds |
| ``blocks.{l}.ln1.hook_scale``, ``ln2.hook_scale``, ``ln_final.hook_scale`` | (batch, pos, 1) | the norm's divisor (read only) |

Split inputs: asking for (or hooking) any ``hook_*_input`` point makes attention compute each query head's query,
key and value from its own copy of the block's input, so a patch or a gradient there reaches that head alone
(with grouped-query attention, head h's own use of the key/value head it shares).

Steps: a run may also keep a family's named module steps (``block_parts``: name -> (module, "input" or "output"),
what the block walks show between the points), in ``HookRun.kept``. Their module hooks are installed once per
module, the first time a run asks for them, and act only for the thread whose run asks.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

SPLIT_POINTS = ("hook_q_input", "hook_k_input", "hook_v_input")
BLOCK_POINTS = ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out", "hook_mlp_in",
                "hook_mlp_out", *SPLIT_POINTS, "ln1.hook_scale", "ln2.hook_scale")
ATTN_POINTS = ("hook_q", "hook_k", "hook_v", "hook_pattern", "hook_z", "hook_result")
READ_ONLY = ("hook_result", "hook_scale")
_NAME = re.compile(r"^(hook_embed|hook_pos_embed|hook_token_type_embed|ln_final\.hook_scale|blocks\.(\d+)\.(?:attn\.)?([a-z0-9_.]+))$")


@dataclass(frozen=True)
class HookPoint:
    """What a hook function receives beside the tensor (as TransformerLens passes its ``HookPoint``)."""

    name: str


HookFn = Callable[[torch.Tensor, HookPoint], "torch.Tensor | None"]
"""A hook function: gets the tensor and its point; a tensor it returns replaces the point's value (same shape)."""


def point_names(n_layers: int, *, pos_embed: bool = False, parallel: bool = False, split: bool = True,
                ln1: bool = True, ln_final: bool = True, type_embed: bool = False) -> list[str]:
    """Every hook point of a model with ``n_layers`` blocks, in the order a pass reaches them (``split``: it has
    split inputs; ``ln1``: a norm before attention or after the first sum; ``ln_final``: a final norm)."""
    names = ["hook_embed"] + (["hook_pos_embed"] if pos_embed else []) + (["hook_token_type_embed"] if type_embed else [])
    for layer in range(n_layers):
        b = f"blocks.{layer}"
        names += [f"{b}.hook_resid_pre"] + ([f"{b}.ln1.hook_scale"] if ln1 else [])
        names += [f"{b}.{p}" for p in SPLIT_POINTS] if split else []
        names += [f"{b}.attn.hook_q", f"{b}.attn.hook_k", f"{b}.attn.hook_v", f"{b}.attn.hook_pattern",
                  f"{b}.attn.hook_z", f"{b}.attn.hook_result", f"{b}.hook_attn_out"]
        names += [] if parallel else [f"{b}.hook_resid_mid", f"{b}.ln2.hook_scale"]
        names += [f"{b}.hook_mlp_in", f"{b}.hook_mlp_out", f"{b}.hook_resid_post"]
    return names + (["ln_final.hook_scale"] if ln_final else [])


def check_name(name: str, n_layers: int) -> None:
    """Raise a ``ValueError`` naming the valid points when ``name`` is not one."""
    m = _NAME.match(name)
    if m is None or (m.group(2) is not None and (int(m.group(2)) >= n_layers or
                                                 f"blocks.0.{'attn.' if name.split('.')[2] == 'attn' else ''}"
                                                 f"{m.group(3)}" not in point_names(1, pos_embed=True))):
        raise ValueError(f"{name!r} is not a hook point of this model (layers 0..{n_layers - 1}). Points: "
                         "hook_embed, hook_pos_embed, blocks.{l}.hook_resid_pre|hook_resid_mid|hook_resid_post, "
                         "blocks.{l}.attn.hook_q|hook_k|hook_v|hook_pattern|hook_z|hook_result, "
                         "blocks.{l}.hook_q_input|hook_k_input|hook_v_input, blocks.{l}.hook_attn_out|hook_mlp_in|"
                         "hook_mlp_out, blocks.{l}.ln1.hook_scale|ln2.hook_scale, ln_final.hook_scale.")


# -- writing helpers ---------------------------------------------------------------------------
def patch(value: torch.Tensor, positions: Sequence[int] | slice | None = None) -> HookFn:
    """A hook that replaces the point's value with ``value`` (same shape) at ``positions`` (all by default)."""
    def fn(t: torch.Tensor, _point: HookPoint) -> torch.Tensor:
        v = value.to(device=t.device, dtype=t.dtype)
        if positions is None:
            return v.expand_as(t)
        out = t.clone()
        out[:, positions] = v[:, positions] if v.shape == t.shape else v
        return out
    return fn


def add(delta: torch.Tensor, positions: Sequence[int] | slice | None = None) -> HookFn:
    """A hook that adds ``delta`` to the point's value at ``positions`` (all by default)."""
    def fn(t: torch.Tensor, _point: HookPoint) -> torch.Tensor:
        d = delta.to(device=t.device, dtype=t.dtype)
        if positions is None:
            return t + d
        out = t.clone()
        out[:, positions] = out[:, positions] + (d[:, positions] if d.shape == t.shape else d)
        return out
    return fn


# -- the run -----------------------------------------------------------------------------------
Step = tuple[torch.nn.Module, str]
"""A named module step: (module, "input" or "output"), what a family's ``block_parts`` gives for each name."""


class HookRun:
    """One pass's hook points: what to cache, the hook functions, whether to keep gradients, split inputs; and the
    named module steps to keep (``steps``, a family's ``block_parts``), each at its first call outside every block
    or inside block ``steps_layer`` (a module shared by every block counts in that one), in ``kept``."""

    def __init__(self, names: Iterable[str] = (), hooks: Iterable[tuple[str, HookFn]] = (), *, grad: bool = False,
                 split: bool | None = None, keep_rope: bool = False, steps: Mapping[str, Step] | None = None,
                 steps_layer: int | None = None) -> None:
        self.names = frozenset(names)
        self.hooks: dict[str, list[HookFn]] = {}
        for name, fn in hooks:
            self.hooks.setdefault(name, []).append(fn)
        self.cache: dict[str, torch.Tensor] = {}
        self.grad = grad
        wanted = self.names | set(self.hooks)
        self.split = any(n.endswith(SPLIT_POINTS) for n in wanted) if split is None else split
        self._wanted = wanted
        self._layers_attn = {int(n.split(".")[1]) for n in wanted if n.startswith("blocks.") and
                             (".attn." in n and not n.endswith(("hook_z", "hook_result")) or n.endswith(SPLIT_POINTS))}
        self.resid: dict[int, torch.Tensor] = {}  # this pass's resid_pre per layer (resid_mid, split inputs)
        self.rope: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # rotary cos, sin per layer (split inputs)
        self.keep_rope = keep_rope  # keep each layer's rotary cos and sin (the QK attribution applies them to parts)
        self.block: int | None = None  # the block this pass is in (between its resid_pre and resid_post)
        self.steps: dict[torch.nn.Module, list[tuple[str, str]]] = {}  # module -> its (name, "input" | "output")
        for step, (module, what) in (steps or {}).items():
            self.steps.setdefault(module, []).append((step, what))
        self.steps_layer = steps_layer
        self.kept: dict[str, torch.Tensor] = {}  # step name -> the module's input or output, as the module has it

    def wants(self, name: str) -> bool:
        return name in self._wanted

    def attention_wanted(self, layer: int) -> bool:
        """Whether layer ``layer``'s attention function must run through the hook points."""
        return self.split or layer in self._layers_attn

    def visit(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """Run the point's hook functions on ``t`` and cache the result when asked for; returns the value to use."""
        for fn in self.hooks.get(name, ()):
            out = fn(t, HookPoint(name))
            if out is not None and name.endswith(READ_ONLY):
                raise ValueError(f"{name!r} is read only (a hook may read it and return None): patch hook_z (a "
                                 "head's write) or the norm's input instead.")
            if out is not None:
                if tuple(out.shape[1:]) != tuple(t.shape[1:]):  # a batch may grow (patching runs copies at once)
                    raise ValueError(f"A hook on {name} returned shape {tuple(out.shape)}; the point has "
                                     f"{tuple(t.shape)}.")
                t = out
        if name in self.names:
            if self.grad and t.requires_grad:
                t.retain_grad()
            self.cache[name] = t
        return t

    def written(self, name: str) -> bool:
        return name in self.hooks

    def keep_step(self, module: torch.nn.Module, inputs: tuple, output: Any) -> None:
        """Keep ``module``'s steps from this call: the first call outside every block or inside ``steps_layer``."""
        if self.block is not None and self.block != self.steps_layer:
            return
        for step, what in self.steps.get(module, ()):
            if step not in self.kept:
                self.kept[step] = inputs[0] if what == "input" else output


_RUN: contextvars.ContextVar[HookRun | None] = contextvars.ContextVar("ae_hook_run", default=None)


def current_run() -> HookRun | None:
    """This thread's hook run, if its pass opened one."""
    return _RUN.get()


@contextlib.contextmanager
def hook_run(run: HookRun) -> Iterator[HookRun]:
    """Make ``run`` this thread's hook run for the passes inside the block (installing, once per module, the hooks
    of the steps it keeps)."""
    if run.steps:
        _install_steps(run.steps)
    token = _RUN.set(run)
    try:
        yield run
    finally:
        _RUN.reset(token)


# -- the steps' module hooks -------------------------------------------------------------------
_INSTALL = threading.Lock()


def _install_steps(modules: Iterable[torch.nn.Module]) -> None:
    """Hook each step module once (a run's ``steps``); the hook keeps a step only for the thread whose run asks."""
    with _INSTALL:
        for module in modules:
            if not getattr(module, "_ae_step_point", False):
                module.register_forward_hook(_step_point)
                module._ae_step_point = True


def _step_point(module: torch.nn.Module, inputs: tuple, output: Any) -> None:
    run = _RUN.get()
    if run is not None and module in run.steps:
        run.keep_step(module, inputs, output)
