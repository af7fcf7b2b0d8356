"""``unembed(..., rows=...)``: a few tokens' logits equal those columns of the whole unembedding, softcap and bias
included, in every tiny decoder family, and the patching metric that reads two of them."""

from __future__ import annotations

import torch

from model_core.models.loading import load_pretrained


def test_a_few_rows_are_the_whole_unembeddings_columns(tiny_decoder):
    loaded = load_pretrained(str(tiny_decoder), device="cpu")
    family, model = loaded.family, loaded.model
    torch.manual_seed(0)
    hidden = torch.randn(3, model.config.hidden_size)
    rows = [5, 2, 5, model.config.vocab_size - 1]
    with torch.no_grad():
        whole = family.unembed(model, hidden)
        some = family.unembed(model, hidden, rows=rows)
    assert some.shape == (3, len(rows))
    torch.testing.assert_close(some, whole[:, rows], rtol=1e-5, atol=1e-5)


def test_the_rows_carry_the_gradient_of_the_whole(tiny_decoder):
    loaded = load_pretrained(str(tiny_decoder), device="cpu")
    family, model = loaded.family, loaded.model
    torch.manual_seed(1)
    hidden = torch.randn(1, model.config.hidden_size, requires_grad=True)
    whole = family.unembed(model, hidden)
    (g_whole,) = torch.autograd.grad(whole[0, 3] - whole[0, 7], hidden)
    some = family.unembed(model, hidden, rows=(3, 7))
    (g_some,) = torch.autograd.grad(some[0, 0] - some[0, 1], hidden)
    torch.testing.assert_close(g_some, g_whole, rtol=1e-5, atol=1e-6)
