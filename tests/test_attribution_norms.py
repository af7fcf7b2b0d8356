"""Freezing a norm (model_core.effects.norms.freeze): LayerNorms without a gain or a bias, and modules that are no
norm, which get a ValueError that says so rather than an AttributeError."""

from __future__ import annotations

import pytest
import torch

from model_core.effects.norms import freeze


def _x() -> torch.Tensor:
    return torch.randn(3, 8, generator=torch.Generator().manual_seed(0)) * 2.0 + 0.5


@pytest.mark.parametrize("kwargs", [{}, {"bias": False}, {"elementwise_affine": False}])
def test_layer_norms_with_or_without_gain_and_bias_are_frozen(kwargs):
    torch.manual_seed(1)
    norm = torch.nn.LayerNorm(8, **kwargs)
    if norm.weight is not None:
        with torch.no_grad():
            norm.weight.uniform_(0.5, 1.5)
    x = _x()
    frozen = freeze(norm, x)
    got = frozen.apply(x) + (0 if frozen.bias is None else frozen.bias)
    torch.testing.assert_close(got, norm(x).detach())
    assert (frozen.bias is None) == (norm.bias is None)


def test_an_rms_norm_without_a_gain_is_frozen():
    norm = torch.nn.RMSNorm(8, eps=1e-6, elementwise_affine=False)
    x = _x()
    frozen = freeze(norm, x)
    torch.testing.assert_close(frozen.apply(x), norm(x))


@pytest.mark.parametrize("module", [torch.nn.Identity(), torch.nn.Linear(8, 8, bias=False), torch.nn.Tanh()])
def test_a_module_that_is_no_norm_gets_a_value_error(module):
    with pytest.raises(ValueError, match="not a LayerNorm or an RMSNorm|not a norm this tool can freeze"):
        freeze(module, _x())


class _HalfRmsNorm(torch.nn.Module):
    """Llama's RMSNorm as transformers writes it: the statistics in float32, the gain applied in the input's dtype."""

    def __init__(self, d: int, eps: float = 1e-6, offset: float = 0.0) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, d))
        self.variance_epsilon, self.offset = eps, offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(x.dtype) + self.offset


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_rms_norm_is_frozen_within_its_rounding(dtype):
    """A model in bfloat16 (a GPU's default over 1B parameters) rounds the module and the frozen map differently;
    that is not an unsupported norm. Before, the 1e-4 check refused every Llama-family model in bfloat16."""
    norm = _HalfRmsNorm(64).to(dtype)
    x = (torch.randn(5, 64, generator=torch.Generator().manual_seed(0)) * 3).to(dtype)
    frozen = freeze(norm, x)
    torch.testing.assert_close(frozen.apply(x).float(), norm(x).float(), rtol=0.05, atol=0.05)


def test_a_half_precision_module_of_another_form_is_still_refused():
    """A norm that adds a constant the map does not know is off by far more than bfloat16's rounding."""
    norm = _HalfRmsNorm(64, offset=0.5).to(torch.bfloat16)
    x = (torch.randn(5, 64, generator=torch.Generator().manual_seed(0)) * 3).to(torch.bfloat16)
    with pytest.raises(ValueError, match="not a norm this tool can freeze"):
        freeze(norm, x)


class _NearlyRmsNorm(_HalfRmsNorm):
    """An RMSNorm of another form by 0.8%: its mean square over all but one of the d_model numbers."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).sum(-1, keepdim=True) / (h.shape[-1] - 1) + self.variance_epsilon)
        return self.weight * h.to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_norm_is_checked_in_float32_so_a_near_form_is_refused(dtype):
    """The form is checked on a float32 copy of the module: a norm 0.8% from an RMSNorm, under bfloat16's rounding
    (which a check in bfloat16 must allow), is refused; the float32 model's map is refused alike."""
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(0)) * 3
    for norm, at in [(_NearlyRmsNorm(64).to(dtype), x.to(dtype)), (_NearlyRmsNorm(64), x)]:
        with pytest.raises(ValueError, match="not a norm this tool can freeze"):
            freeze(norm, at)
    assert freeze(_HalfRmsNorm(64).to(dtype), x.to(dtype)).scale.dtype == dtype  # the map itself stays in it
