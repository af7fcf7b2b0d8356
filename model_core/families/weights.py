"""Every family's attention weights in TransformerLens's form (``W_Q``, ``W_K``, ``W_V``, ``W_O`` per head, the biases,
the norm before attention), so that weight-only analyses (composition scores, the score decomposition) name no
module of a model: ``layer_weights(model)``.

TransformerLens's row convention: a head's query is ``q = x_normed @ W_Q[h] + b_Q[h]`` and its write into the residual
stream is ``z[h] @ W_O[h]`` (plus the layer's one ``b_O``), so ``W_QK = W_Q W_K^T`` and ``W_OV = W_V W_O`` are
(d_model, d_model) matrices read left to right. The tensors are views of the model's parameters where the layout
allows (never write into them) and live on the model's device in its dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from model_core.families import family_of


@dataclass(frozen=True, eq=False)
class LayerWeights:
    """One layer's attention weights, TransformerLens's names and row convention.

    Attributes:
        W_Q: (head, d_model, d_head); ``q = x_normed @ W_Q[h] + b_Q[h]`` (before any per-head norm and the rotary
            embedding).
        W_K, W_V: (kv_head, d_model, d_head); query head ``h`` reads key/value head ``kv_of_head[h]``.
        W_O: (head, d_head, d_model); a head's write is ``z[h] @ W_O[h]``, the layer's output ``sum_h z[h] @ W_O[h] +
            b_O`` (before ``out_norm``, where the family has one).
        b_Q: (head, d_head), b_K, b_V: (kv_head, d_head), b_O: (d_model,); None where the model has no such bias.
        ln1_w: (d_model,) the effective per-feature scale of the norm before attention (Gemma's RMSNorm multiplies by
            ``1 + weight``: that sum is here); None where no norm comes before attention (post-LN BERT and the
            chapter-3 encoder with post-LN, OLMo 2).
        ln1_b: (d_model,) that norm's bias (LayerNorm's beta), else None.
        ln1_kind: "rms", "layer" or None (no norm before attention).
        ln1_eps: that norm's epsilon (0.0 where there is none).
        kv_of_head: the key/value head each query head reads (grouped-query attention).
        scale: the model's own score scale (1/sqrt(d_head) unless the family says otherwise: Gemma 2/3's
            ``query_pre_attn_scalar``, GPT-2's ``scale_attn_by_inverse_layer_idx``).
        q_norm_w: (head, d_head) the effective scale of a norm on the queries after W_Q (Qwen3 and Gemma 3: one RMSNorm
            a head; OLMo 2: one RMSNorm over every head's queries at once, see ``qk_norm_per_head``; Phi's optional
            per-head LayerNorm: its scale, its bias left out), else None.
        k_norm_w: (kv_head, d_head) likewise for the keys, else None.
        qk_norm_per_head: whether those norms normalise each head on its own (False: over all heads together).
        qk_norm_eps: their epsilon (0.0 where there are none).
        out_norm_w: (d_model,) the effective scale of an RMSNorm on the attention's output before the residual sum
            (Gemma 2/3 and OLMo 2's ``post_attention_layernorm``), else None.
        out_norm_eps: its epsilon (0.0 where there is none).
    """

    W_Q: torch.Tensor
    W_K: torch.Tensor
    W_V: torch.Tensor
    W_O: torch.Tensor
    b_Q: torch.Tensor | None
    b_K: torch.Tensor | None
    b_V: torch.Tensor | None
    b_O: torch.Tensor | None
    ln1_w: torch.Tensor | None
    ln1_b: torch.Tensor | None
    ln1_kind: str | None
    ln1_eps: float
    kv_of_head: tuple[int, ...]
    scale: float
    q_norm_w: torch.Tensor | None = None
    k_norm_w: torch.Tensor | None = None
    qk_norm_per_head: bool = True
    qk_norm_eps: float = 0.0
    out_norm_w: torch.Tensor | None = None
    out_norm_eps: float = 0.0

    def __post_init__(self) -> None:
        n_heads, d_model, d_head = self.W_Q.shape
        n_kv = self.W_K.shape[0]
        assert self.W_K.shape == self.W_V.shape == (n_kv, d_model, d_head), (self.W_K.shape, self.W_V.shape)
        assert self.W_O.shape == (n_heads, d_head, d_model), self.W_O.shape
        assert len(self.kv_of_head) == n_heads and all(0 <= k < n_kv for k in self.kv_of_head), self.kv_of_head
        assert self.ln1_kind in ("rms", "layer", None), self.ln1_kind

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(head, kv_head, d_model, d_head)."""
        n_heads, d_model, d_head = (int(x) for x in self.W_Q.shape)
        return n_heads, int(self.W_K.shape[0]), d_model, d_head

    n_heads = property(lambda self: self.shape[0])
    n_kv_heads = property(lambda self: self.shape[1])
    d_model = property(lambda self: self.shape[2])
    d_head = property(lambda self: self.shape[3])

    def normed(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` through the norm before attention, from these weights (the identity where there is none).

        Shape: (..., d_model) -> (..., d_model).
        """
        if self.ln1_kind is None:
            return x
        x = x.to(self.ln1_w.dtype) if self.ln1_w is not None else x
        if self.ln1_kind == "layer":
            x = x - x.mean(-1, keepdim=True)
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.ln1_eps)
        else:
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.ln1_eps)
        x = x * self.ln1_w
        return x if self.ln1_b is None else x + self.ln1_b


def layer_weights(model: Any) -> list[LayerWeights]:
    """Every layer's attention weights of a loaded model (a transformers model of any supported family, or the
    chapter-3 encoder), in TransformerLens's form.

    Raises:
        ValueError: no family serves the model.
    """
    family = family_of(model)
    read = {"gpt2": _gpt2, "llama": _llama, "bert": _bert, "custom": _custom}.get(family.name)
    if read is None:
        raise ValueError(f"No attention weights are read for the {family.label} family yet; add it to "
                         "model_core.families.weights.")
    kv = tuple(int(k) for k in family.kv_heads(model.config))
    blocks = model.encoder.layers if family.name == "custom" else family.layers(model)
    with torch.no_grad():
        return [read(model, block, kv) for block in blocks]


# -- layouts ----------------------------------------------------------------------------------------
def _rows_per_head(weight: torch.Tensor, n: int) -> torch.Tensor:
    """An ``nn.Linear`` weight of (n * d_head, d_model) as TransformerLens's (n, d_model, d_head)."""
    d_model = weight.shape[1]
    return weight.detach().view(n, -1, d_model).transpose(1, 2)  # (n, d_head, d_model) -> (n, d_model, d_head)


def _bias_per_head(bias: torch.Tensor | None, n: int) -> torch.Tensor | None:
    return None if bias is None else bias.detach().view(n, -1)  # (n, d_head)


def _out_per_head(weight: torch.Tensor, n: int) -> torch.Tensor:
    """An output ``nn.Linear`` weight of (d_model, n * d_head) as (n, d_head, d_model)."""
    return weight.detach().T.reshape(n, -1, weight.shape[0])


def _detached(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach()


def _norm(module: Any, *, one_plus: bool = False) -> tuple[torch.Tensor | None, torch.Tensor | None, str | None, float]:
    """(scale, bias, kind, eps) of an RMSNorm or a LayerNorm module; all None (eps 0) for no module."""
    if module is None:
        return None, None, None, 0.0
    weight = module.weight.detach()
    if isinstance(module, torch.nn.LayerNorm):
        return weight, _detached(module.bias), "layer", float(module.eps)
    eps = getattr(module, "variance_epsilon", None)
    eps = getattr(module, "eps", 1e-6) if eps is None else eps
    return (1.0 + weight if one_plus else weight), _detached(getattr(module, "bias", None)), "rms", float(eps)


# -- families ---------------------------------------------------------------------------------------
def _gpt2(model: Any, block: Any, kv: tuple[int, ...]) -> LayerWeights:
    """GPT-2: one Conv1D ``c_attn`` kept (in, out) with q, k, v side by side; ``c_proj`` (in, out)."""
    attn = block.attn
    n = len(kv)
    w, b = attn.c_attn.weight.detach(), attn.c_attn.bias.detach()  # (d_model, 3 * d_model), (3 * d_model,)
    d = w.shape[0]
    per_head = lambda m: m.view(d, n, -1).transpose(0, 1)  # (d_model, n * d_head) -> (n, d_model, d_head)
    ln_w, ln_b, kind, eps = _norm(block.ln_1)
    return LayerWeights(
        W_Q=per_head(w[:, :d]), W_K=per_head(w[:, d:2 * d]), W_V=per_head(w[:, 2 * d:]),
        W_O=attn.c_proj.weight.detach().view(n, -1, d), b_Q=b[:d].view(n, -1), b_K=b[d:2 * d].view(n, -1),
        b_V=b[2 * d:].view(n, -1), b_O=attn.c_proj.bias.detach(), ln1_w=ln_w, ln1_b=ln_b, ln1_kind=kind, ln1_eps=eps,
        kv_of_head=kv, scale=_scale(attn, d // n))


def _llama(model: Any, block: Any, kv: tuple[int, ...]) -> LayerWeights:
    """Llama and its kin: q/k/v projections (Phi-3: one fused ``qkv_proj``), ``o_proj`` (Phi: ``dense``), an RMSNorm
    (Gemma: ``1 + weight``; Phi: a LayerNorm) before attention, and any per-head q/k norms and attention-output norm."""
    attn = block.self_attn
    n, n_kv = len(kv), max(kv) + 1
    gemma = str(model.config.model_type).startswith("gemma")  # Gemma's RMSNorms scale by 1 + weight
    if hasattr(attn, "qkv_proj"):  # Phi-3: rows are q (heads), then k and v (kv heads each)
        w = attn.qkv_proj.weight.detach()
        d_head = w.shape[0] // (n + 2 * n_kv)
        b = attn.qkv_proj.bias
        sizes = [n * d_head, n_kv * d_head, n_kv * d_head]
        q_w, k_w, v_w = w.split(sizes)
        q_b, k_b, v_b = (None, None, None) if b is None else b.detach().split(sizes)
    else:
        q_w, k_w, v_w = attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight
        q_b, k_b, v_b = attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias
    o_proj = attn.o_proj if hasattr(attn, "o_proj") else attn.dense  # Phi: dense
    ln_w, ln_b, kind, eps = _norm(getattr(block, "input_layernorm", None), one_plus=gemma)
    W_Q = _rows_per_head(q_w, n)
    q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
    if q_norm is None:  # Phi's optional per-head LayerNorms are named so
        q_norm, k_norm = getattr(attn, "q_layernorm", None), getattr(attn, "k_layernorm", None)
    q_s, _, _, qk_eps = _norm(q_norm, one_plus=gemma)
    k_s, _, _, _ = _norm(k_norm, one_plus=gemma)
    per_head = q_s is None or q_s.numel() == W_Q.shape[2]  # OLMo 2 norms the whole projection
    # Gemma 2/3 and OLMo 2 norm the attention's output before the sum (where Llama's norm of that name is the MLP's).
    has_out_norm = hasattr(block, "post_feedforward_layernorm")
    out_w, _, _, out_eps = _norm(block.post_attention_layernorm if has_out_norm else None, one_plus=gemma)
    return LayerWeights(
        W_Q=W_Q, W_K=_rows_per_head(k_w, n_kv), W_V=_rows_per_head(v_w, n_kv), W_O=_out_per_head(o_proj.weight, n),
        b_Q=_bias_per_head(q_b, n), b_K=_bias_per_head(k_b, n_kv), b_V=_bias_per_head(v_b, n_kv),
        b_O=_detached(o_proj.bias), ln1_w=ln_w, ln1_b=ln_b, ln1_kind=kind, ln1_eps=eps, kv_of_head=kv,
        scale=_scale(attn, W_Q.shape[2]),
        q_norm_w=None if q_s is None else q_s.expand(n, -1) if per_head else q_s.view(n, -1),
        k_norm_w=None if k_s is None else k_s.expand(n_kv, -1) if per_head else k_s.view(n_kv, -1),
        qk_norm_per_head=per_head, qk_norm_eps=qk_eps, out_norm_w=out_w, out_norm_eps=out_eps)


def _bert(model: Any, block: Any, kv: tuple[int, ...]) -> LayerWeights:
    """BERT: query/key/value linears, ``attention.output.dense``; post-LN, so no norm before attention."""
    attention = block.attention
    sa, n = attention.self, len(kv)
    dense = attention.output.dense
    W_Q = _rows_per_head(sa.query.weight, n)
    return LayerWeights(
        W_Q=W_Q, W_K=_rows_per_head(sa.key.weight, n), W_V=_rows_per_head(sa.value.weight, n),
        W_O=_out_per_head(dense.weight, n), b_Q=_bias_per_head(sa.query.bias, n),
        b_K=_bias_per_head(sa.key.bias, n), b_V=_bias_per_head(sa.value.bias, n), b_O=_detached(dense.bias),
        ln1_w=None, ln1_b=None, ln1_kind=None, ln1_eps=0.0, kv_of_head=kv, scale=_scale(sa, W_Q.shape[2]))


def _custom(model: Any, block: Any, kv: tuple[int, ...]) -> LayerWeights:
    """The chapter-3 encoder: one q/k/v linear per head, ``output_linear``; its LayerNorm comes before attention
    (pre-LN, the book's) or after the residual sum (post-LN, BERT's)."""
    heads = block.attention.heads
    stack = lambda name: torch.stack([getattr(h, name).weight.detach().T for h in heads])  # (head, d_model, d_head)
    bias = lambda name: torch.stack([getattr(h, name).bias.detach() for h in heads])  # (head, d_head)
    out = block.attention.output_linear
    pre = block.norm_placement == "pre"
    ln_w, ln_b, kind, eps = _norm(block.layer_norm_1 if pre else None)
    W_Q = stack("q")
    return LayerWeights(
        W_Q=W_Q, W_K=stack("k"), W_V=stack("v"), W_O=_out_per_head(out.weight, len(heads)), b_Q=bias("q"),
        b_K=bias("k"), b_V=bias("v"), b_O=out.bias.detach(), ln1_w=ln_w, ln1_b=ln_b, ln1_kind=kind, ln1_eps=eps,
        kv_of_head=kv, scale=1.0 / math.sqrt(W_Q.shape[2]))


def _scale(attn: Any, d_head: int) -> float:
    """The score scale the attention module passes its attention function (transformers keeps it as ``scaling``)."""
    scaling = getattr(attn, "scaling", None)
    return float(scaling) if scaling is not None else 1.0 / math.sqrt(d_head)
