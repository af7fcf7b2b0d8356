"""Named hook points: every point equals a plain-hook or transformers reference on every family, patching a point
with its own value changes nothing, and gradients at split inputs equal finite differences."""

from __future__ import annotations

import threading

import pytest
import torch

from model_core.chapter3.config import EncoderConfig
from model_core.chapter3.model import build_random_model
from model_core.families import family_of
from model_core.families.hooked import model_points, run_with_hooks
from model_core.families.hooks import READ_ONLY, HookRun, hook_run, patch
from model_core.models.loading import load_pretrained, load_pretrained_uncached

IDS = torch.tensor([[3, 5, 7, 9, 11, 13, 4, 6, 8]])


def _names(model) -> list[str]:
    return model_points(model)


def _plain_reference(model, ids) -> dict[str, torch.Tensor]:
    """Each point read with plain torch hooks on the modules and transformers' own outputs, not the hook layer."""
    family = family_of(model)
    n_layers, n_heads = family.n_layers(model.config), family.n_heads(model.config)
    ref: dict[str, torch.Tensor] = {}
    handles = []

    def keep(name, pick):
        def hook(_m, args, out=None):
            ref[name] = pick(args, out).detach().clone()
        return hook

    main = lambda out: out if isinstance(out, torch.Tensor) else out[0]  # noqa: E731
    for layer in range(n_layers):
        parts, b = family.parts(model, layer), f"blocks.{layer}"
        handles.append(parts.block.register_forward_pre_hook(
            keep(f"{b}.hook_resid_pre", lambda a, o: a[0]) if a_first(parts) else _kw_pre(ref, f"{b}.hook_resid_pre"),
            with_kwargs=not a_first(parts)))
        handles.append(parts.o_proj.register_forward_pre_hook(
            keep(f"{b}.attn.hook_z", lambda a, o: a[0].view(*a[0].shape[:-1], n_heads, -1))))
        write = parts.o_proj if parts.post_norm else parts.attn_write
        handles.append(write.register_forward_hook(keep(f"{b}.hook_attn_out", lambda a, o: main(o))))
        if parts.mlp is not None:
            entry = parts.ln2 if parts.ln2 is not None and not parts.parallel else parts.mlp_input_module
            handles.append(entry.register_forward_pre_hook(keep(f"{b}.hook_mlp_in", lambda a, o: a[0])))
            handles.append(parts.mlp_output_module.register_forward_hook(
                keep(f"{b}.hook_mlp_out", lambda a, o: main(o))))
        if parts.post_norm:
            handles.append(parts.post_ln1.register_forward_pre_hook(keep(f"{b}.hook_resid_mid", lambda a, o: a[0])))
        handles.append(parts.block.register_forward_hook(
            keep(f"{b}.hook_resid_post", lambda a, o: o.output if hasattr(o, "output") else main(o))))
    try:
        with torch.no_grad():
            out = family.forward(model, ids, torch.zeros_like(ids), None, vectors=True, hidden=False)
    finally:
        for h in handles:
            h.remove()
    for layer in range(n_layers):
        b = f"blocks.{layer}"
        if out.queries is not None and out.queries[layer] is not None:
            ref[f"{b}.attn.hook_q"] = out.queries[layer].transpose(1, 2)
            ref[f"{b}.attn.hook_k"] = out.keys[layer].transpose(1, 2)
            ref[f"{b}.attn.hook_v"] = out.values[layer].transpose(1, 2)
        ref[f"{b}.attn.hook_pattern"] = out.weights[layer]
    return ref


def a_first(parts) -> bool:
    """The chapter-3 encoder's layer takes its input positionally; transformers' blocks by keyword or position."""
    return hasattr(parts.block, "norm_placement")


def _kw_pre(ref, name):
    def hook(_m, args, kwargs):
        ref[name] = (kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]).detach().clone()
    return hook


def _models(tiny_decoders) -> dict:
    models = {f: load_pretrained(str(folder), device="cpu").model for f, folder in tiny_decoders.items()}
    for placement in ("pre", "post"):
        cfg = EncoderConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=32, norm_placement=placement)
        models[f"custom-{placement}"] = build_random_model(cfg, seed=0).eval()
    return models


@pytest.fixture(scope="module")
def models(tiny_decoders, bundled):
    out = _models(tiny_decoders)
    out["bert"] = bundled.model
    return out


def test_every_point_equals_a_plain_hook_reference(models):
    for label, model in models.items():
        family = family_of(model)
        got = run_with_hooks(model, IDS, names=_names(model)).cache
        ref = _plain_reference(model, IDS)
        assert ref, label
        for name, want in ref.items():
            have = got[name]
            if name.endswith(("hook_k", "hook_v")) and have.shape != want.shape:  # split: each query head's copy
                kv = torch.as_tensor(family.kv_heads(model.config))
                want = want.index_select(2, kv)
            torch.testing.assert_close(have, want, atol=1e-5, rtol=1e-5, msg=lambda m: f"{label} {name}: {m}")
        n_layers = family.n_layers(model.config)
        for layer in range(n_layers):  # identities that tie the remaining points to the ones above
            b, parts = f"blocks.{layer}", family.parts(model, layer)
            x = got[f"{b}.hook_resid_pre"]
            if f"{b}.hook_q_input" in got:  # the chapter-3 encoder has no split inputs
                torch.testing.assert_close(got[f"{b}.hook_q_input"], x[:, :, None].expand_as(got[f"{b}.hook_q_input"]))
            if not parts.post_norm and not parts.parallel:
                torch.testing.assert_close(got[f"{b}.hook_resid_mid"], x + got[f"{b}.hook_attn_out"])
            norm = parts.ln1 if not parts.post_norm else parts.post_ln1
            if norm is not None:
                src = x if not parts.post_norm else got[f"{b}.hook_resid_mid"]
                want = _scale64(norm, src)
                torch.testing.assert_close(got[f"{b}.ln1.hook_scale"].double(), want, atol=1e-5, rtol=1e-5)
            if parts.attn_post_norm is None:
                bias = parts.o_proj.bias
                summed = got[f"{b}.attn.hook_result"].sum(2) + (0 if bias is None else bias)
                torch.testing.assert_close(summed, got[f"{b}.hook_attn_out"], atol=1e-5, rtol=1e-5)


def _scale64(norm, x):
    x = x.double()
    eps = next(getattr(norm, n) for n in ("variance_epsilon", "eps") if hasattr(norm, n))
    if isinstance(norm, torch.nn.LayerNorm):
        return torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + eps)
    return torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def test_patching_a_point_with_its_own_value_changes_nothing(models):
    for label, model in models.items():
        names = _names(model)
        writable = [n for n in names if not n.endswith(READ_ONLY)]
        if label.startswith("custom"):  # its q, k, v and pattern are read only
            writable = [n for n in writable if not n.endswith(("hook_q", "hook_k", "hook_v", "hook_pattern"))]
        clean = run_with_hooks(model, IDS, names=names)
        last = [n for n in names if n.endswith("hook_resid_post")][-1]
        patched = run_with_hooks(model, IDS, names=[last], hooks=[(n, patch(clean.cache[n])) for n in writable])
        assert torch.equal(patched.cache[last], clean.cache[last]), label
        assert clean.logits is None or torch.equal(patched.logits, clean.logits), label


def test_a_patch_reaches_only_its_point(models):
    model = models["llama"]  # grouped-query attention: 4 query heads, 2 key/value heads
    torch.manual_seed(0)
    direction = torch.randn(model.config.hidden_size)

    def bump(t, _point):
        t = t.clone()
        t[:, :, 1] += direction
        return t
    clean = run_with_hooks(model, IDS, names=["blocks.1.attn.hook_k"], split=True)
    bumped = run_with_hooks(model, IDS, names=["blocks.1.attn.hook_k"], hooks=[("blocks.1.hook_k_input", bump)])
    moved = (bumped.cache["blocks.1.attn.hook_k"] - clean.cache["blocks.1.attn.hook_k"]).abs().amax(dim=(0, 1, 3))
    assert moved[1] > 1e-2  # head 1's own use of the key/value head it shares with head 0 ...
    assert float(moved[0]) == 0.0 and float(moved[2:].abs().max()) == 0.0  # ... and no other head's


@pytest.mark.parametrize("family_name,point", [("llama", "blocks.1.hook_k_input"), ("gpt2", "blocks.1.hook_q_input"),
                                               ("gemma2", "blocks.0.hook_v_input"), ("gpt2", "blocks.0.hook_mlp_in"),
                                               ("llama", "blocks.1.hook_mlp_in"), ("llama", "blocks.1.hook_resid_mid")])
def test_gradients_at_split_inputs_equal_finite_differences(tiny_decoders, family_name, point):
    model = load_pretrained_uncached(str(tiny_decoders[family_name]), device="cpu").model.double()  # our own copy
    if True:
        torch.manual_seed(1)
        metric = lambda logits: logits[0, -1, 5] - logits[0, -1, 7]  # noqa: E731
        out = run_with_hooks(model, IDS, names=[point], grad=True)
        metric(out.logits).backward()
        grad = out.cache[point].grad
        direction = torch.zeros_like(grad)
        if direction.dim() == 4:
            direction[:, :, 1] = torch.randn_like(direction[:, :, 1])  # head 1 alone, at every position
        else:
            direction = torch.randn_like(direction)
        # The tiny models are sharpened (peaked attention), so the step is small; Llama's RMSNorm computes in float32
        # even in a float64 model, so not smaller than 1e-4 (its rounding, 1e-7, stays small beside the step).
        eps = 1e-4

        def shifted(sign):
            hook = (point, lambda t, _p: t + sign * eps * direction)
            with torch.no_grad():
                return float(metric(run_with_hooks(model, IDS, hooks=[hook]).logits))
        numeric = (shifted(1) - shifted(-1)) / (2 * eps)
        analytic = float((grad * direction).sum())
        assert abs(analytic) > 1e-6
        assert abs(numeric - analytic) <= 1e-3 * max(1.0, abs(analytic))


def test_bad_names_and_read_only_points_get_clear_messages(models):
    model = models["llama"]
    with pytest.raises(ValueError, match="not a hook point"):
        run_with_hooks(model, IDS, names=["blocks.9.hook_resid_pre"])
    with pytest.raises(ValueError, match="not a hook point"):
        run_with_hooks(model, IDS, names=["blocks.0.hook_nothing"])
    with pytest.raises(ValueError, match="read only"):
        run_with_hooks(model, IDS, hooks=[("blocks.0.attn.hook_result", lambda t, p: t)])
    seen = []
    run_with_hooks(model, IDS, hooks=[("blocks.0.attn.hook_result", lambda t, p: seen.append(t.shape))])
    assert seen == [torch.Size([1, IDS.shape[1], 4, model.config.hidden_size])]  # a reader may watch it
    with pytest.raises(ValueError, match="no such point"):
        run_with_hooks(models["phi"], IDS, names=["blocks.0.hook_resid_mid"])


def test_a_runs_steps_are_this_threads_calls_in_the_asked_block(models):
    """A run keeps its named module steps (the walks' ``Family.block_parts``) at their first call outside every block
    or inside ``steps_layer``, and never from another thread's pass on the shared model."""
    model = models["llama"]
    family = family_of(model)
    embed, ln0, ln1 = family.embed_parts(model).embed, family.parts(model, 0).ln1, family.parts(model, 1).ln1
    steps = {"embed": (embed, "output"), "ln_0": (ln0, "output"), "ln_1": (ln1, "output"), "ln_1_in": (ln1, "input")}
    other = torch.tensor([[4, 4, 4, 4]])
    run = HookRun(["blocks.1.hook_resid_pre"], steps=steps, steps_layer=1)
    with hook_run(run):
        thread = threading.Thread(target=lambda: family.forward(model, other, torch.zeros_like(other), None,
                                                                vectors=False, hidden=False))
        thread.start()
        thread.join()
        assert run.kept == {} and run.cache == {}  # another thread's pass on the shared model keeps nothing
        family.forward(model, IDS, torch.zeros_like(IDS), None, vectors=False, hidden=False)
    assert set(run.kept) == {"embed", "ln_1", "ln_1_in"}  # block 0's call of its norm is not block 1's
    resid = run.cache["blocks.1.hook_resid_pre"]
    with torch.inference_mode():
        torch.testing.assert_close(run.kept["ln_1_in"], resid)
        torch.testing.assert_close(run.kept["ln_1"], ln1(resid))
        torch.testing.assert_close(run.kept["embed"], embed(IDS))
