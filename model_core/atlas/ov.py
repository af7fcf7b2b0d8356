"""What a head writes, from the weights alone: the copying score of its OV circuit (Elhage et al., 2021).

The full OV circuit of a head maps a token to the logits its write gives every token: ``M = W_E W_V W_O W_U^T``
(TransformerLens's row convention; (vocab, vocab)). Elhage et al. summarise it by its eigenvalues: a head that copies
(raises the logit of the token it attends to) has mostly positive eigenvalues. The score here is theirs,
``Re(Σ λ) / Σ |λ|``, in [−1, 1] (1: every eigenvalue positive); the share of positive eigenvalue mass is
``(1 + score) / 2`` for real eigenvalues.

The approximation, said plainly:

- ``M`` is restricted to the ``top_n`` first ids of the vocabulary, special tokens left out (a BPE or WordPiece
  vocabulary is ordered roughly by frequency, so these are its common tokens);
- the norms are folded in as TransformerLens's ``fold_ln`` does: the scale of the norm before attention into W_V (a
  LayerNorm's centring too, ``model_core.qk.composition.fold_heads``), the final norm's gain (and centring) into W_U;
  the norms' division by each position's rms or σ is left out (it depends on the input), and so are the biases;
- ``M`` has rank d_head, so its non-zero eigenvalues are those of the (d_head, d_head) matrix
  ``W_O (W_U[S]^T W_E[S]) W_V`` (TransformerLens's ``FactoredMatrix.eigenvalues``): no (vocab, vocab) matrix is formed.

Encoders without an unembedding have no score (None).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from model_core.effects.norms import freeze
from model_core.families import family_of
from model_core.families.weights import layer_weights
from model_core.qk.composition import fold_heads
from model_core.kernel import float64_device
from model_core.qk.frozen import on

TOP_N = 4096
"""Tokens the OV circuit is restricted to."""


def vocabulary_subset(tokenizer: Any, vocab_size: int, top_n: int = TOP_N) -> np.ndarray:
    """The first ``top_n`` ids of the vocabulary that are not special tokens. Shape: -> (n,) int64."""
    special = set(getattr(tokenizer, "all_special_ids", ()) or ()) if tokenizer is not None else set()
    ids = [i for i in range(vocab_size) if i not in special]
    return np.asarray(ids[:top_n], dtype=np.int64)


def folded_unembedding(model: Any, rows: torch.Tensor | None = None,
                       at: torch.device | str = "cpu") -> torch.Tensor | None:
    """W_U with the final norm's gain (and a LayerNorm's centring) folded in, float64 on ``at``; None for a model
    without an unembedding. ``rows``: only these tokens' rows (the whole vocabulary in float64 is 226 MB for SmolLM2).
    Shape: -> (vocab or len(rows), d_model)."""
    family = family_of(model)
    if not family.is_decoder:
        return None
    head = model.get_output_embeddings()
    if head is None:
        return None
    w_u = head.weight.detach()
    w_u = (w_u if rows is None else w_u[rows.to(w_u.device)]).to(at, torch.float64)
    norm = family.final_norm(model)
    if norm is not None:
        probe = torch.randn(w_u.shape[1], generator=torch.Generator().manual_seed(0))
        param = next(model.parameters())
        frozen = freeze(norm, probe.to(param.device, param.dtype))  # only its gain and centring are read
        w_u = w_u * frozen.weight.detach().to(at, torch.float64)
        if frozen.centred:
            w_u = w_u - w_u.mean(dim=1, keepdim=True)
    return w_u


def copying_scores(model: Any, tokenizer: Any = None, top_n: int = TOP_N) -> np.ndarray | None:
    """Every head's copying score (the module's docstring); None for a model without an unembedding.

    Computed in float64 where the model is (the CPU for a device without float64), one layer at a time: a model's
    every attention weight in float64 at once is 10.7 GB for an 8B model, held on the host before (2.9 GB above
    the model for Qwen2.5-1.5B's shape, 0.3 GB now). Each layer's (head, d_head, d_head) matrices come to the host
    for their eigenvalues: one small copy a layer.

    Shape: -> (layer, head) float64.
    """
    family = family_of(model)
    head = model.get_output_embeddings() if family.is_decoder else None
    if head is None:
        return None
    embed = family.embed_parts(model).embed.weight.detach()
    at = float64_device(embed.device)
    ids = torch.as_tensor(vocabulary_subset(tokenizer, min(embed.shape[0], head.weight.shape[0]), top_n))
    w_u = folded_unembedding(model, ids, at)  # (S, d_model)
    w_e = embed[ids.to(embed.device)].to(at, torch.float64)
    gram = w_u.T @ w_e  # (d_model, d_model): W_U[S]^T W_E[S]
    del w_u, w_e
    weights = layer_weights(model)
    if any(w.W_Q.shape != weights[0].W_Q.shape or w.W_K.shape != weights[0].W_K.shape for w in weights):
        raise ValueError("Copying scores need every layer to have the same heads and shapes.")  # as fold_heads says
    scores = []
    for lw in weights:
        heads = fold_heads([on(lw, at)], torch.float64)  # one layer: the folds are each layer's own
        w_v = heads.W_V.flatten(0, 1)[heads.head_kv()]  # (head, d_model, d_head)
        small = (heads.W_O @ gram @ w_v).cpu()  # (head, d_head, d_head): eigenvalues on the host, any device
        eig = torch.linalg.eigvals(small)  # (head, d_head) complex
        total = eig.abs().sum(-1)
        scores.append(torch.where(total > 0, eig.sum(-1).real / total.clamp_min(1e-300), torch.zeros_like(total)))
    return torch.stack(scores).numpy()

