"""The one route's options for effects and generation: reading and replacing head outputs (the hook layer's
``blocks.{l}.attn.hook_z`` around ``Family.forward``), autograd (grad), a key/value cache (past) and true positions
(position_ids), each against transformers' own model run plainly."""

import pytest
import torch

from model_core.families.hooks import HookRun, hook_run
from model_core.models.loading import load_pretrained

FAMILIES = ("gpt2", "llama", "qwen2")


@pytest.fixture(params=FAMILIES)
def loaded(request, tiny_decoders):
    return load_pretrained(str(tiny_decoders[request.param]), device="cpu")


def _ids(loaded, text: str = "time flies like an arrow and fruit flies like a banana") -> torch.Tensor:
    return torch.tensor([loaded.tokenizer(text)["input_ids"]])


def _run(loaded, ids, *, edit_z=None, **kw):
    """One pass through the route; ``edit_z(layer, z)`` on every layer's ``hook_z`` (a tensor it returns replaces z)."""
    hooks = [] if edit_z is None else [(f"blocks.{layer}.attn.hook_z", lambda z, _p, layer=layer: edit_z(layer, z))
                                       for layer in range(loaded.family.n_layers(loaded.model.config))]
    with hook_run(HookRun(hooks=hooks)):
        return loaded.family.forward(loaded.model, ids, torch.zeros_like(ids), None, vectors=False, hidden=False,
                                     logits=True, **kw)


def test_hook_z_reads_every_layer_and_leaves_the_pass_alone(loaded):
    ids = _ids(loaded)
    seen = {}

    def read(layer, z):
        seen[layer] = z.clone()

    out = _run(loaded, ids, edit_z=read)
    plain = _run(loaded, ids)
    assert sorted(seen) == list(range(loaded.family.n_layers(loaded.model.config)))
    assert seen[0].shape[:3] == (1, ids.shape[1], loaded.family.n_heads(loaded.model.config))
    torch.testing.assert_close(out.lm_logits, plain.lm_logits)


def test_hook_z_replacing_one_head_equals_a_plain_hook_on_the_output_projection(loaded):
    ids = _ids(loaded)
    n_heads = loaded.family.n_heads(loaded.model.config)

    def zero_head(layer, z):
        if layer != 1:
            return None
        z = z.clone()
        z[:, :, 2] = 0.0
        return z

    out = _run(loaded, ids, edit_z=zero_head)
    # Reference: zero head 2's slice of the output projection's input with a hook, outside the route.
    block = loaded.family.layers(loaded.model)[1]
    proj = block.attn.c_proj if hasattr(block, "attn") else block.self_attn.o_proj
    d_head = proj.weight.shape[0 if hasattr(block, "attn") else 1] // n_heads  # GPT-2's Conv1D keeps (in, out)

    def hook(_m, args):
        x = args[0].clone()
        x[..., 2 * d_head:3 * d_head] = 0.0
        return (x,)

    handle = proj.register_forward_pre_hook(hook)
    try:
        with torch.no_grad():
            ref = loaded.model(input_ids=ids, use_cache=False).logits
    finally:
        handle.remove()
    torch.testing.assert_close(out.lm_logits, ref, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out.lm_logits, _run(loaded, ids).lm_logits)


def test_grad_gives_gradients_of_the_logit_with_respect_to_z(loaded):
    ids = _ids(loaded)
    kept = {}

    def keep(layer, z):
        z = z.detach().requires_grad_(True)
        kept[layer] = z
        return z

    out = _run(loaded, ids, grad=True, edit_z=keep)
    out.lm_logits[0, -1, 5].backward()
    assert kept[0].grad is not None and kept[0].grad.abs().sum() > 0
    with pytest.raises(RuntimeError):  # without grad the pass is in inference mode
        _run(loaded, ids).lm_logits[0, -1, 5].backward()


def test_greedy_steps_with_a_cache_equal_transformers_generate(loaded):
    from transformers import DynamicCache

    ids = _ids(loaded)
    past = DynamicCache(config=loaded.model.config)
    out = _run(loaded, ids, past=past)
    new = []
    for _ in range(6):
        nxt = out.lm_logits[0, -1].argmax().view(1, 1)
        new.append(int(nxt))
        out = _run(loaded, nxt, past=out.past)
    with torch.no_grad():
        ref = loaded.model.generate(ids, max_new_tokens=6, do_sample=False, min_new_tokens=6,
                                    pad_token_id=loaded.tokenizer.pad_token_id or 0)
    assert new == ref[0, ids.shape[1]:].tolist()


def test_position_ids_give_the_last_token_its_true_position(loaded):
    """A shorter cache (the first token dropped) with the last token at its true position differs from the same cache
    read at the cache's length; at the true position with the full cache it equals the plain pass."""
    from transformers import DynamicCache

    ids = _ids(loaded)
    n = ids.shape[1]
    past = DynamicCache(config=loaded.model.config)
    _run(loaded, ids[:, :-1], past=past)
    true_pos = torch.tensor([[n - 1]])
    full = _run(loaded, ids[:, -1:], past=past, position_ids=true_pos)
    torch.testing.assert_close(full.lm_logits[0, -1], _run(loaded, ids).lm_logits[0, -1], atol=1e-5, rtol=1e-5)
    if loaded.family.name == "gpt2":
        return  # GPT-2's learned positions: the cache test below is about rotary angles
    short = DynamicCache(config=loaded.model.config)
    _run(loaded, ids[:, :-1], past=short)
    for layer in short.layers:
        layer.keys, layer.values = layer.keys[:, :, 1:], layer.values[:, :, 1:]
    at_true = _run(loaded, ids[:, -1:], past=short, position_ids=true_pos).lm_logits[0, -1]
    short2 = DynamicCache(config=loaded.model.config)
    _run(loaded, ids[:, :-1], past=short2)
    for layer in short2.layers:
        layer.keys, layer.values = layer.keys[:, :, 1:], layer.values[:, :, 1:]
    at_length = _run(loaded, ids[:, -1:], past=short2).lm_logits[0, -1]
    assert not torch.allclose(at_true, at_length, atol=1e-4)


def test_an_encoder_has_no_cache(tiny_bert):
    from model_core.families import family_named

    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="no key/value cache"):
        family_named("bert").forward(tiny_bert, ids, torch.zeros_like(ids), None, past=object())
