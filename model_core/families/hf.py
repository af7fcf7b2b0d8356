"""What every transformers family shares (BERT and the decoders): one forward pass through the capturing attention
function, with the residual stream from hooks on the layers. Each family says where its parts are."""

from __future__ import annotations

from typing import Any, Callable, ClassVar

import torch

from model_core.families.base import Family, ForwardOutput
from model_core.families.capture import current_recorder, recording
from model_core.trace.gate import GATE


class TransformersFamily(Family):
    """A transformers model whose attention layers call ``AttentionInterface`` (loaded by ``model_core.models.loading``)."""

    uses_token_types: ClassVar[bool] = False

    def base(self, model: Any) -> Any:
        """The model without its language-model head."""
        raise NotImplementedError

    def layers(self, model: Any) -> list[Any]:
        """The transformer blocks, in order."""
        raise NotImplementedError

    @torch.inference_mode()
    def forward(self, model: Any, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor | None, *, head_mask: torch.Tensor | None = None,
                vectors: bool = True, hidden: bool | str = True, compact: bool = False,
                on_layer: Callable[[int], None] | None = None, logits: bool = False,
                stop_after: int | None = None) -> ForwardOutput:
        """As ``Family.forward``; ``logits`` adds the next-token logits (the unembedding costs a pass of its own
        over the vocabulary, so corpus batches leave it out). ``stop_after`` runs the blocks up to that one and
        records it alone (the block walk): the lists hold None for the blocks before it, and there are no logits."""
        layers = self.layers(model)
        with GATE.turn(), recording(vectors=vectors, gate=head_mask, hidden=hidden, only=stop_after,
                                    compact=compact, on_layer=on_layer) as rec:
            stop = None if stop_after is None else layers[stop_after].register_forward_hook(_stopper(rec))
            try:
                net = model if logits and stop is None else self.base(model)
                extra = {"token_type_ids": token_type_ids} if self.uses_token_types else {"use_cache": False}
                out = net(input_ids=input_ids, attention_mask=attention_mask, **extra)
            except _PassStopped:
                out = None
            finally:
                if stop is not None:
                    stop.remove()
        n_layers = len(layers) if stop_after is None else stop_after + 1
        recorded = rec.queries if compact else rec.weights
        if len(recorded) != (n_layers if stop_after is None else 1):
            raise RuntimeError(f"Recorded {len(recorded)} of {n_layers} attention layers: load the model with "
                               "model_core.models.loading so its attention goes through the capturing function.")
        pick = lambda d: [d.get(i) for i in range(n_layers)]  # noqa: E731
        first = min(rec.masks)
        common = dict(queries=pick(rec.queries) if vectors or compact else None,
                      keys=pick(rec.keys) if vectors or compact else None,
                      hidden=rec.residual if hidden else None, score_scale=rec.scaling[first],
                      score_softcap=rec.softcap.get(first), lm_logits=out.logits if logits and out is not None else None)
        if compact:
            return ForwardOutput(weights=[], values=None, mask=None, layer_masks=pick(rec.masks),
                                 layer_scales=pick(rec.scaling), layer_softcaps=pick(rec.softcap), **common)
        return ForwardOutput(weights=pick(rec.weights), values=pick(rec.values) if vectors else None,
                             mask=self._allowed(rec.masks[first], input_ids), **common)

    def _allowed(self, mask: torch.Tensor | None, input_ids: torch.Tensor) -> torch.Tensor:
        """The mask the first layer received as booleans. Shape: -> (batch, q_pos, k_pos), True = may attend."""
        if mask is not None:
            return (mask[:, 0] > torch.finfo(mask.dtype).min / 2) if mask.dtype != torch.bool else mask[:, 0]
        n = input_ids.shape[1]
        allowed = torch.ones(n, n, dtype=torch.bool, device=input_ids.device)
        return (allowed.tril() if self.is_decoder else allowed)[None].expand(len(input_ids), -1, -1)


class _PassStopped(Exception):
    """Raised by the hook ``stop_after`` puts on a block: the pass has what it needs."""


def _stopper(rec: Any):
    """A forward hook that ends this thread's pass after the block (the model is shared: another session's pass
    through the same block runs on)."""
    def stop(_module: Any, _args: Any, _output: Any) -> None:
        if current_recorder() is rec:
            raise _PassStopped
    return stop

