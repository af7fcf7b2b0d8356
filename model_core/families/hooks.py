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
| ``blocks.{l}.attn.hook_z`` | (batch, pos, head, d_head) | the heads' outputs, the output projection's input |
| ``blocks.{l}.attn.hook_result`` | (batch, pos, head, d_model) | each head's write, z through its slice of W_O (read only, computed only when asked for) |
| ``blocks.{l}.hook_q_input`` / ``hook_k_input`` / ``hook_v_input`` | (batch, pos, head, d_model) | each query head's own copy of resid_pre, before the norm (split inputs) |
| ``blocks.{l}.hook_attn_out`` | (batch, pos, d_model) | what attention adds to the residual stream (Gemma 2/3: after its post-norm) |
| ``blocks.{l}.hook_mlp_in`` / ``hook_mlp_out`` | (batch, pos, d_model) | the MLP's own copy of the residual stream before its norm (post-LN: the MLP's input; Phi-1/2: the normed input it shares with attention) / what the MLP adds |
| ``blocks.{l}.ln1.hook_scale``, ``ln2.hook_scale``, ``ln_final.hook_scale`` | (batch, pos, 1) | the norm's divisor (read only) |

Split inputs: asking for (or hooking) any ``hook_*_input`` point makes attention compute each query head's query,
key and value from its own copy of the block's input, so a patch or a gradient there reaches that head alone
(with grouped-query attention, head h's own use of the key/value head it shares).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from model_core.families.parts import BlockParts, norm_scale

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
class HookRun:
    """One pass's hook points: what to cache, the hook functions, whether to keep gradients, split inputs."""

    def __init__(self, names: Iterable[str] = (), hooks: Iterable[tuple[str, HookFn]] = (), *, grad: bool = False,
                 split: bool | None = None, keep_rope: bool = False) -> None:
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


_RUN: contextvars.ContextVar[HookRun | None] = contextvars.ContextVar("ae_hook_run", default=None)


def current_run() -> HookRun | None:
    """This thread's hook run, if its pass opened one."""
    return _RUN.get()


@contextlib.contextmanager
def hook_run(run: HookRun) -> Iterator[HookRun]:
    """Make ``run`` this thread's hook run for the passes inside the block."""
    token = _RUN.set(run)
    try:
        yield run
    finally:
        _RUN.reset(token)


# -- installing the module hooks ---------------------------------------------------------------
_INSTALL = threading.Lock()


def install_hook_points(model: Any, family: Any, n_layers: int) -> None:
    """Hook a model's modules once for the named points (they do nothing unless this thread's pass opened a
    ``HookRun``). Called when a model is loaded, before any pass can run on it."""
    with _INSTALL:
        if getattr(model, "_ae_hook_points", False):
            return
        ep = family.embed_parts(model)
        ep.embed.register_forward_hook(_embed_point)
        if ep.pos_embed is not None:
            ep.pos_embed.register_forward_hook(_output_point("hook_pos_embed"))
        if ep.type_embed is not None:
            ep.type_embed.register_forward_hook(_output_point("hook_token_type_embed"))
        if ep.final_norm is not None:
            ep.final_norm.register_forward_pre_hook(_scale_point("ln_final.hook_scale", ep.final_norm))
        for layer in range(n_layers):
            _install_block(family, model, layer, family.parts(model, layer))
        model._ae_hook_points = True


def _install_block(family: Any, model: Any, layer: int, parts: BlockParts) -> None:
    b = f"blocks.{layer}"
    parts.block.register_forward_pre_hook(_resid_pre(layer), with_kwargs=True)
    parts.block.register_forward_hook(_output_point(f"{b}.hook_resid_post"))
    n_heads = family.n_heads(model.config)
    w_o = family.output_weights(model)[layer]  # (d_model, head * d_head), held by the model
    parts.o_proj.register_forward_pre_hook(_z_point(layer, n_heads, w_o))
    if parts.post_norm:
        parts.o_proj.register_forward_hook(_output_point(f"{b}.hook_attn_out"))
        parts.post_ln1.register_forward_pre_hook(_input_point(f"{b}.hook_resid_mid"))
        parts.post_ln1.register_forward_pre_hook(_scale_point(f"{b}.ln1.hook_scale", parts.post_ln1))
        parts.post_ln2.register_forward_pre_hook(_scale_point(f"{b}.ln2.hook_scale", parts.post_ln2))
        parts.mlp_input_module.register_forward_pre_hook(_input_point(f"{b}.hook_mlp_in"))
        parts.mlp_output_module.register_forward_hook(_output_point(f"{b}.hook_mlp_out"))
        _install_attention(family, model, layer, parts)
        return
    parts.attn_write.register_forward_hook(_attn_out(layer, parts.parallel))
    if parts.ln1 is not None:
        parts.ln1.register_forward_pre_hook(_scale_point(f"{b}.ln1.hook_scale", parts.ln1))
    if parts.mlp is not None:
        # As TransformerLens's: the MLP's own copy of the residual stream, before its norm (a write reaches the MLP
        # alone); a parallel block's MLP shares attention's normed input, so there it is that input.
        entry = parts.ln2 if parts.ln2 is not None and not parts.parallel else parts.mlp_input_module
        entry.register_forward_pre_hook(_input_point(f"{b}.hook_mlp_in", own_copy=True))
        parts.mlp_output_module.register_forward_hook(_output_point(f"{b}.hook_mlp_out"))
    if parts.ln2 is not None:
        parts.ln2.register_forward_pre_hook(_scale_point(f"{b}.ln2.hook_scale", parts.ln2))
    if family.is_decoder:
        parts.attn.register_forward_pre_hook(_rope(layer), with_kwargs=True)
    _install_attention(family, model, layer, parts)


def _install_attention(family: Any, model: Any, layer: int, parts: BlockParts) -> None:
    """Where q, k, v and the pattern are reached: transformers' attention function (``capture.py`` calls
    ``hooked_attention``), or the chapter-3 encoder's own heads (read only)."""
    heads = getattr(parts.attn, "heads", None)
    if heads is None:
        project = getattr(family, "project_heads", None)
        parts.attn._ae_project = None if project is None else functools.partial(project, model, layer)
        return
    seen: list[Any] = []
    for i, head in enumerate(heads):
        head.register_forward_hook(_custom_head(layer, i, len(heads), seen))


def _custom_head(layer: int, index: int, n_heads: int, seen: list[Any]):
    """The chapter-3 encoder computes its heads one by one: gather their records, and visit q, k, v and the pattern
    when the last one is done (read only)."""
    b = f"blocks.{layer}.attn"

    def hook(_module: Any, _args: Any, record: Any) -> None:
        run = _RUN.get()
        if run is None or not run.attention_wanted(layer):
            return
        if run.split or any(run.written(f"{b}.{p}") for p in ("hook_q", "hook_k", "hook_v", "hook_pattern")):
            raise ValueError("The chapter-3 encoder computes each head in its own module: its q, k, v and pattern "
                             "can be read, not written (patch hook_z or the residual stream instead).")
        if index == 0:
            seen.clear()
        seen.append(record)
        if index == n_heads - 1:
            for name, get in (("hook_q", lambda r: r.query), ("hook_k", lambda r: r.key),
                              ("hook_v", lambda r: r.value)):
                if run.wants(f"{b}.{name}"):
                    run.visit(f"{b}.{name}", torch.stack([get(r) for r in seen], dim=2))  # (batch, pos, head, d)
            if run.wants(f"{b}.hook_pattern"):
                run.visit(f"{b}.hook_pattern", torch.stack([r.step.weights for r in seen], dim=1))
    return hook


def _main(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "_replace") and hasattr(out, "output"):  # the chapter-3 encoder's LayerRecord
        return out.output
    return out[0]


def _with_main(out: Any, t: torch.Tensor) -> Any:
    if isinstance(out, torch.Tensor):
        return t
    if hasattr(out, "_replace") and hasattr(out, "output"):
        return out._replace(output=t)
    return (t, *out[1:])


def _output_point(name: str):
    def hook(_module: Any, _args: Any, output: Any) -> Any:
        run = _RUN.get()
        if run is None or not run.wants(name):
            return None
        return _with_main(output, run.visit(name, _main(output)))
    return hook


def _embed_point(_module: Any, _args: Any, output: torch.Tensor) -> torch.Tensor | None:
    """``hook_embed``; in a gradient run, also where autograd starts (the weights need not require grad)."""
    run = _RUN.get()
    if run is None:
        return None
    if run.grad and not output.requires_grad:
        output = output.detach().requires_grad_()
    return run.visit("hook_embed", output) if run.wants("hook_embed") else output


def _input_point(name: str, own_copy: bool = False):
    """A point at a module's input; ``own_copy``: the module reads its own copy of a tensor the model also uses
    elsewhere (the MLP's input is the residual stream itself), so a write, or a gradient, reaches this module alone."""
    def hook(_module: Any, args: tuple) -> Any:
        run = _RUN.get()
        if run is None or not run.wants(name):
            return None
        return (run.visit(name, args[0].clone() if own_copy else args[0]), *args[1:])
    return hook


def _scale_point(name: str, norm: Any):
    def hook(_module: Any, args: tuple) -> None:
        run = _RUN.get()
        # ndim 3 only: with split inputs the norm also runs on each head's copy, (batch, pos, head, d_model)
        if run is not None and run.wants(name) and args[0].dim() == 3:
            run.visit(name, norm_scale(norm, args[0]).to(args[0].dtype))
    return hook


def _resid_pre(layer: int):
    name = f"blocks.{layer}.hook_resid_pre"

    def hook(_module: Any, args: tuple, kwargs: dict) -> Any:
        run = _RUN.get()
        if run is None:
            return None
        in_kwargs = "hidden_states" in kwargs
        x = kwargs["hidden_states"] if in_kwargs else args[0]
        if run.wants(name):
            x = run.visit(name, x)
        run.resid[layer] = x
        if in_kwargs:
            return args, {**kwargs, "hidden_states": x}
        return (x, *args[1:]), kwargs
    return hook


def _rope(layer: int):
    def hook(_module: Any, _args: tuple, kwargs: dict) -> None:
        run = _RUN.get()
        if run is not None and (run.split or run.keep_rope) and kwargs.get("position_embeddings") is not None:
            run.rope[layer] = kwargs["position_embeddings"]
    return hook


def _z_point(layer: int, n_heads: int, w_o: torch.Tensor):
    z_name, result_name = f"blocks.{layer}.attn.hook_z", f"blocks.{layer}.attn.hook_result"

    def hook(_module: Any, args: tuple) -> Any:
        run = _RUN.get()
        if run is None or not (run.wants(z_name) or run.wants(result_name)):
            return None
        flat = args[0]
        z = flat.view(*flat.shape[:-1], n_heads, -1)  # (batch, pos, head, d_head)
        if run.wants(z_name):
            z = run.visit(z_name, z)
        if run.wants(result_name):
            w = w_o.view(w_o.shape[0], n_heads, -1)  # (d_model, head, d_head)
            run.visit(result_name, torch.einsum("bphd,mhd->bphm", z, w.to(z.dtype)))
        return (z.reshape(flat.shape), *args[1:])
    return hook


def _attn_out(layer: int, parallel: bool):
    name, mid = f"blocks.{layer}.hook_attn_out", f"blocks.{layer}.hook_resid_mid"

    def hook(_module: Any, _args: Any, output: Any) -> Any:
        run = _RUN.get()
        if run is None or not (run.wants(name) or run.wants(mid)):
            return None
        out = _main(output)
        if run.wants(name):
            out = run.visit(name, out)
        if run.wants(mid) and not parallel:
            pre = run.resid[layer]
            whole = pre + out
            new = run.visit(mid, whole)
            # The model adds ``out`` to its own copy of resid_pre: route a write (or a gradient) through resid_mid.
            if (run.grad and mid in run.names) or (new is not whole and not torch.equal(new, whole)):
                out = new - pre
        return _with_main(output, out)
    return hook
