"""Installing the named hook points (``model_core.families.hooks``) on a model's modules: once per model, when it
loads; each hook acts only for the thread whose pass opened a ``HookRun``. The adapters say where every point is
(``Family.parts``, ``Family.embed_parts``)."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from model_core.families.hooks import HookRun, current_run, hook_run
from model_core.families.parts import BlockParts, norm_scale

_INSTALL = threading.Lock()


@contextlib.contextmanager
def open_run(model: Any, family: Any, run: HookRun) -> Iterator[HookRun]:
    """Make ``run`` this thread's hook run on ``model`` for the passes inside the block, its points installed first
    (once per model: a model not loaded by ``model_core.models``, a test's, gets them here)."""
    install_hook_points(model, family, family.n_layers(model.config))
    with hook_run(run):
        yield run


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
    parts.block.register_forward_hook(_resid_post(layer))
    n_heads = family.n_heads(model.config)
    # read at each pass, not kept: a view such as GPT-2's transposed Conv1D weight, taken here, would stay on the
    # CPU when the model moves to a GPU after its hooks are installed (``model.to`` replaces each parameter's data)
    parts.o_proj.register_forward_pre_hook(_z_point(layer, n_heads, lambda: family.output_weights(model)[layer]))
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
        run = current_run()
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
        run = current_run()
        if run is None or not run.wants(name):
            return None
        return _with_main(output, run.visit(name, _main(output)))
    return hook


def _embed_point(_module: Any, _args: Any, output: torch.Tensor) -> torch.Tensor | None:
    """``hook_embed``; in a gradient run, also where autograd starts (the weights need not require grad)."""
    run = current_run()
    if run is None:
        return None
    if run.grad and not output.requires_grad:
        output = output.detach().requires_grad_()
    return run.visit("hook_embed", output) if run.wants("hook_embed") else output


def _input_point(name: str, own_copy: bool = False):
    """A point at a module's input; ``own_copy``: the module reads its own copy of a tensor the model also uses
    elsewhere (the MLP's input is the residual stream itself), so a write, or a gradient, reaches this module alone."""
    def hook(_module: Any, args: tuple) -> Any:
        run = current_run()
        if run is None or not run.wants(name):
            return None
        return (run.visit(name, args[0].clone() if own_copy else args[0]), *args[1:])
    return hook


def _scale_point(name: str, norm: Any):
    def hook(_module: Any, args: tuple) -> None:
        run = current_run()
        # ndim 3 only: with split inputs the norm also runs on each head's copy, (batch, pos, head, d_model)
        if run is not None and run.wants(name) and args[0].dim() == 3:
            run.visit(name, norm_scale(norm, args[0]).to(args[0].dtype))
    return hook


def _resid_pre(layer: int):
    name = f"blocks.{layer}.hook_resid_pre"

    def hook(_module: Any, args: tuple, kwargs: dict) -> Any:
        run = current_run()
        if run is None:
            return None
        in_kwargs = "hidden_states" in kwargs
        x = kwargs["hidden_states"] if in_kwargs else args[0]
        if run.wants(name):
            x = run.visit(name, x)
        run.resid[layer] = x
        run.block = layer
        if in_kwargs:
            return args, {**kwargs, "hidden_states": x}
        return (x, *args[1:]), kwargs
    return hook


def _resid_post(layer: int):
    name, point = f"blocks.{layer}.hook_resid_post", _output_point(f"blocks.{layer}.hook_resid_post")

    def hook(module: Any, args: Any, output: Any) -> Any:
        run = current_run()
        if run is None:
            return None
        run.block = None
        return point(module, args, output) if run.wants(name) else None
    return hook


def _rope(layer: int):
    def hook(_module: Any, _args: tuple, kwargs: dict) -> None:
        run = current_run()
        if run is not None and (run.split or run.keep_rope) and kwargs.get("position_embeddings") is not None:
            run.rope[layer] = kwargs["position_embeddings"]
    return hook


def _z_point(layer: int, n_heads: int, w_o: Callable[[], torch.Tensor]):
    z_name, result_name = f"blocks.{layer}.attn.hook_z", f"blocks.{layer}.attn.hook_result"

    def hook(_module: Any, args: tuple) -> Any:
        run = current_run()
        if run is None or not (run.wants(z_name) or run.wants(result_name)):
            return None
        flat = args[0]
        z = flat.view(*flat.shape[:-1], n_heads, -1)  # (batch, pos, head, d_head)
        if run.wants(z_name):
            z = run.visit(z_name, z)
        if run.wants(result_name):
            weight = w_o()  # (d_model, head * d_head)
            w = weight.view(weight.shape[0], n_heads, -1)  # (d_model, head, d_head)
            run.visit(result_name, torch.einsum("bphd,mhd->bphm", z, w.to(z.dtype)))
        return (z.reshape(flat.shape), *args[1:])
    return hook


def _attn_out(layer: int, parallel: bool):
    name, mid = f"blocks.{layer}.hook_attn_out", f"blocks.{layer}.hook_resid_mid"

    def hook(_module: Any, _args: Any, output: Any) -> Any:
        run = current_run()
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
