"""The tokens a block promotes and suppresses: its output at one position through the final norm (its scale frozen at
the residual after the block, ``model_core.effects.norms.freeze``) and the unembedding. Decoders only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from model_core.effects.norms import freeze
from model_core.families.checks import require_decoder
from model_core.gate import GATE
from model_core.trace.forward import to_host


@dataclass(frozen=True)
class BlockTokens:
    """What one block's output at one position writes onto the vocabulary, strongest first.

    Attributes:
        block: "attention" or "ffn".
        layer, position: where.
        promoted, suppressed: (token text, logit change) pairs.
    """

    block: str
    layer: int
    position: int
    promoted: tuple[tuple[str, float], ...]
    suppressed: tuple[tuple[str, float], ...]

    def rows(self) -> list[dict[str, Any]]:
        """Rows for a table or CSV: rank, promoted token and logit, suppressed token and logit."""
        return [{"rank": r + 1, "promoted": p[0], "promoted_logit": p[1], "suppressed": s[0], "suppressed_logit": s[1]}
                for r, (p, s) in enumerate(zip(self.promoted, self.suppressed))]


@torch.no_grad()
def block_tokens(flow: Any, model: Any, family: Any, tokenizer: Any, layer: int, position: int,
                 k: int = 10) -> tuple[BlockTokens, BlockTokens]:
    """The attention block's and the MLP block's promoted and suppressed tokens at one position.

    Raises:
        ValueError: the model is not a decoder (an encoder has no unembedding).
    """
    require_decoder(family, "reading a block's promoted and suppressed tokens")
    vec = flow.vectors(layer, [position])
    unembed = model.get_output_embeddings().weight  # (vocab, d_model)
    norm = family.final_norm(model)
    out = []
    for block, part, residual in (("attention", vec.attention_out, vec.resid_mid), ("ffn", vec.mlp_out, vec.resid_post)):
        with GATE.turn():  # the final norm and the vocabulary product: the model's weights, under the route's gate
            frozen = freeze(norm, residual.to(unembed.dtype))
            logits = (frozen.apply(part.to(unembed.dtype)) @ unembed.T)[0].float()
            top, bottom = logits.topk(k), (-logits).topk(k)
        top_ids, top_logits, bottom_ids, bottom_logits = to_host(  # one copy
            [top.indices, top.values, bottom.indices, -bottom.values])
        text = lambda ids: [tokenizer.decode([int(i)]) for i in ids]
        out.append(BlockTokens(block, layer, position, tuple(zip(text(top_ids), top_logits.tolist())),
                               tuple(zip(text(bottom_ids), bottom_logits.tolist()))))
    return out[0], out[1]
