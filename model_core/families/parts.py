"""Where a model's parts are: each family's adapter answers ``Family.parts(model, layer)`` and
``Family.embed_parts(model)`` with these, so nothing outside ``families/`` names a module (``o_proj``, ``c_proj``,
``model.transformer.h``) or asks a ``model_type``. The hook layer (``families/hooks.py``) and every analysis that
runs a model's own modules read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True, eq=False)
class BlockParts:
    """One transformer block's modules, by their job.

    A pre-norm block: ``resid_mid = resid_pre + attn_post_norm(attn(ln1(resid_pre)))`` and
    ``resid_post = resid_mid + mlp_post_norm(mlp(ln2(resid_mid)))`` (``attn_post_norm``, ``mlp_post_norm``: Gemma 2/3
    and OLMo 2 only; OLMo 2 has no ``ln1``/``ln2``). A parallel block (Phi-1/2): attention and MLP both read
    ``ln1(resid_pre)`` and ``resid_post = resid_pre + attn + mlp``. A post-norm block (BERT, the chapter-3 encoder
    with post-LN): ``resid_mid = post_ln1(resid_pre + attn(resid_pre))``, ``resid_post = post_ln2(resid_mid +
    mlp(resid_mid))``.

    Attributes:
        block: the block module (its input is ``resid_pre``, its output ``resid_post``).
        attn: the attention module; its output (or its output's first element) is the attention's output after
            the output projection, before any post-norm.
        o_proj: the output projection (an ``nn.Linear``, or GPT-2's ``Conv1D``); its input is the heads' z.
        mlp: the MLP module: input ``hook_mlp_in``, output the MLP's output before any post-norm.
        ln1, ln2: the norms before attention and before the MLP (pre-norm), else None.
        attn_post_norm, mlp_post_norm: norms applied to a sublayer's output before the residual sum, else None.
        post_ln1, post_ln2: a post-norm block's LayerNorms after each residual sum, else None.
        parallel: attention and MLP read the same normed input (Phi-1/2).
        values: each key/value head's values from ``resid_pre`` (the norm, then the value projection), for passes
            that keep no values. Shape: (..., d_model) -> (..., kv_head * d_head).
        q_norm, k_norm: per-head query and key norms before the rotary embedding (Qwen3, Gemma 3), else None.
        mlp_entry, mlp_exit: where the model's own calls enter and leave the MLP, when ``mlp`` is a wrapper the model
            never calls (BERT's ``intermediate`` and ``output.dense``), else None.
    """

    block: torch.nn.Module
    attn: torch.nn.Module
    o_proj: torch.nn.Module
    mlp: torch.nn.Module | None
    ln1: torch.nn.Module | None = None
    ln2: torch.nn.Module | None = None
    attn_post_norm: torch.nn.Module | None = None
    mlp_post_norm: torch.nn.Module | None = None
    post_ln1: torch.nn.Module | None = None
    post_ln2: torch.nn.Module | None = None
    parallel: bool = False
    values: Callable[[torch.Tensor], torch.Tensor] | None = None
    q_norm: torch.nn.Module | None = None
    k_norm: torch.nn.Module | None = None
    mlp_entry: torch.nn.Module | None = None
    mlp_exit: torch.nn.Module | None = None

    @property
    def mlp_input_module(self) -> torch.nn.Module | None:
        """The module the model calls whose input is ``hook_mlp_in`` (BERT: ``intermediate``; else ``mlp``)."""
        return self.mlp_entry if self.mlp_entry is not None else self.mlp

    @property
    def mlp_output_module(self) -> torch.nn.Module | None:
        """The module the model calls whose output is ``hook_mlp_out`` (BERT: ``output.dense``; else the MLP's write)."""
        if self.mlp_exit is not None:
            return self.mlp_exit
        return self.mlp if self.post_norm else self.mlp_write

    @property
    def o_bias(self) -> torch.Tensor | None:
        """The output projection's bias (GPT-2's, Phi's, BERT's), or None (most Llamas)."""
        return getattr(self.o_proj, "bias", None)

    @property
    def post_norm(self) -> bool:
        """A post-norm block (BERT, the chapter-3 encoder with post-LN)."""
        return self.post_ln1 is not None

    @property
    def attn_write(self) -> torch.nn.Module:
        """The module whose output the attention adds to the residual stream (a pre-norm block)."""
        return self.attn_post_norm if self.attn_post_norm is not None else self.attn

    @property
    def mlp_write(self) -> torch.nn.Module | None:
        """The module whose output the MLP adds to the residual stream (a pre-norm block)."""
        return self.mlp_post_norm if self.mlp_post_norm is not None else self.mlp

    @property
    def mlp_reads_resid_pre(self) -> bool:
        """The MLP reads the block's input, not the residual after attention (a parallel block)."""
        return self.parallel


@dataclass(frozen=True, eq=False)
class EmbedParts:
    """The embeddings: ``resid_pre`` of block 0 is ``(embed(ids) + pos_embed(positions)) * scale`` (then a
    LayerNorm, ``norm``, in BERT and the chapter-3 encoder).

    Attributes:
        embed: the token embedding module (``hook_embed`` is its output).
        pos_embed: the learned position embedding (GPT-2, BERT, the chapter-3 encoder), else None.
        type_embed: the segment (token type) embedding (BERT, the chapter-3 encoder), else None.
        scale: Gemma's sqrt(d_model) on the embeddings, else 1.
        norm: the embeddings' LayerNorm (BERT, the chapter-3 encoder), else None.
        final_norm: the norm before the unembedding (``ln_final``), else None.
    """

    embed: torch.nn.Module
    pos_embed: torch.nn.Module | None = None
    type_embed: torch.nn.Module | None = None
    scale: float = 1.0
    norm: torch.nn.Module | None = None
    final_norm: torch.nn.Module | None = None


@dataclass(frozen=True)
class BlockNotes:
    """What a page says about a decoder block that differs by family (``Family.block_notes``; the decoder walk
    carries it), so that no page asks a ``model_type``.

    Attributes:
        norm_eps: the block's input norm's epsilon.
        norm_plus_one: its RMSNorms scale by ``(1 + w)`` rather than ``w`` (Gemma).
        qk_norm: each head's query and key are normed before the rotary embedding (Qwen3, Gemma 3).
        sandwich: each sublayer's output is normed before the residual sum, and the MLP has a norm of its own
            before it (Gemma 2/3).
        activation: the gated MLP's activation, as people write it ("SiLU", "GELU").
        lookup_scale: what the embedding module multiplies its lookup by (Gemma: √d_model), else 1.
    """

    norm_eps: float
    norm_plus_one: bool = False
    qk_norm: bool = False
    sandwich: bool = False
    activation: str = "SiLU"
    lookup_scale: float = 1.0


def adds_one(norm: torch.nn.Module) -> bool:
    """The norm scales by ``(1 + w)`` rather than its weight ``w``: Gemma's RMSNorms, whose classes say so in the
    name (GemmaRMSNorm, Gemma2RMSNorm, Gemma3RMSNorm)."""
    return type(norm).__name__.startswith("Gemma")


def norm_eps(norm: torch.nn.Module) -> float:
    """A norm module's epsilon, whatever the family calls it."""
    for name in ("variance_epsilon", "eps", "epsilon"):
        value = getattr(norm, name, None)
        if value is not None:
            return float(value)
    raise ValueError(f"{type(norm).__name__} has no epsilon this app knows; its family is not supported.")


def is_rms(norm: torch.nn.Module) -> bool:
    """An RMSNorm (no centring, no bias) rather than a LayerNorm."""
    return not isinstance(norm, torch.nn.LayerNorm)


def norm_scale(norm: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The scale a norm divides ``x`` by (TransformerLens's ``hook_scale``): sqrt(mean(x²) + eps) for an RMSNorm,
    sqrt(var(x) + eps) for a LayerNorm, in float32 as the models compute it.

    Shape: (..., d_model) -> (..., 1).
    """
    xf = x.float()
    if is_rms(norm):
        return torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + norm_eps(norm))
    return torch.sqrt(xf.var(-1, keepdim=True, unbiased=False) + norm_eps(norm))
