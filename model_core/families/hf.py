"""What every transformers family shares (BERT and the decoders): one forward pass through the capturing attention
function, with the residual stream from hooks on the layers. Each family says where its parts are."""

from __future__ import annotations

from typing import Any, Callable, ClassVar

import torch

from model_core.families.base import Family, ForwardOutput
from model_core.families.capture import current_recorder, recording
from model_core.gate import GATE
from model_core.kernel import allowed_from_mask


class TransformersFamily(Family):
    """A transformers model whose attention layers call ``AttentionInterface`` (loaded by ``model_core.models.loading``)."""

    uses_token_types: ClassVar[bool] = False

    def base(self, model: Any) -> Any:
        """The model without its language-model head."""
        raise NotImplementedError

    def layers(self, model: Any) -> list[Any]:
        """The transformer blocks, in order."""
        raise NotImplementedError

    def project_heads(self, model: Any, layer: int, inputs: list[torch.Tensor], rope: Any) -> tuple[torch.Tensor, ...]:
        """Each query head's query, key and value from its own copies of the block's input (split inputs): the
        norm, the head's slice of the projections, any per-head norm, the rotary embedding.

        Shape: inputs: 3 of (batch, pos, head, d_model) -> 3 of (batch, head, pos, d_head).
        """
        parts = self.parts(model, layer)
        heads = torch.as_tensor(self.kv_heads(model.config), device=inputs[0].device)
        out = []
        for kind, x in zip("qkv", inputs):
            normed = x if parts.ln1 is None else parts.ln1(x)
            weight, bias = self.projection(model, layer, kind)  # (n * d_head, d_model), (n * d_head,) or None
            d_model = weight.shape[-1]
            w = weight.view(-1, weight.shape[0] // (len(heads) if kind == "q" else self.n_kv_heads(model.config)),
                            d_model)  # (n, d_head, d_model)
            if kind != "q":
                w = w.index_select(0, heads)  # each query head's key/value head
            y = torch.einsum("bphm,hdm->bhpd", normed, w.to(normed.dtype))
            if bias is not None:
                b = bias.view(w.shape[0] if kind == "q" else -1, w.shape[1])
                y = y + (b if kind == "q" else b.index_select(0, heads))[None, :, None, :]
            norm = {"q": parts.q_norm, "k": parts.k_norm}.get(kind)
            if norm is not None:  # per head, over d_head (Qwen3, Gemma 3)
                y = norm(y.transpose(1, 2)).transpose(1, 2)
            out.append(y)
        q, k = self.rotary(parts.attn, out[0], out[1], rope)
        return q, k, out[2]

    def projection(self, model: Any, layer: int, kind: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Block ``layer``'s query, key or value projection as ``nn.Linear`` holds it: (n * d_head, d_model) and
        its bias (or None)."""
        raise NotImplementedError

    def rotary(self, attn: Any, q: torch.Tensor, k: torch.Tensor, rope: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary embedding at the pass's positions (none here: BERT, GPT-2)."""
        return q, k

    def forward(self, model: Any, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor | None, *, head_mask: torch.Tensor | None = None,
                vectors: bool = True, hidden: bool | str = True, compact: bool = False,
                on_layer: Callable[[int], None] | None = None, logits: bool = False,
                stop_after: int | None = None, grad: bool = False,
                past: Any = None, position_ids: torch.Tensor | None = None) -> ForwardOutput:
        """As ``Family.forward``; ``logits`` adds the next-token logits (the unembedding costs a pass of its own
        over the vocabulary, so corpus batches leave it out). ``stop_after`` runs the blocks up to that one and
        records it alone (the block walk): the lists hold None for the blocks before it, and there are no logits.

        Args:
            grad: run with autograd (attribution patching's backward pass); otherwise in inference mode.
            past: a decoder's key/value cache (a transformers ``Cache``) to extend: generation, the KV-cache page.
                The cache is used and returned as ``ForwardOutput.past``.
            position_ids: (batch, pos) true positions of ``input_ids`` (a compressed cache's last token keeps its
                own, n - 1; transformers would otherwise take the cache's length). transformers derives the cache
                position and the causal mask from them.
        """
        if past is not None and not self.is_decoder:
            raise ValueError(f"A {self.label} has no key/value cache; generation and the KV cache need a decoder.")
        with torch.inference_mode(not grad):
            return self._forward(model, input_ids, token_type_ids, attention_mask, head_mask=head_mask,
                                 vectors=vectors, hidden=hidden, compact=compact, on_layer=on_layer, logits=logits,
                                 stop_after=stop_after, past=past, position_ids=position_ids)

    def _forward(self, model: Any, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                 attention_mask: torch.Tensor | None, *, head_mask: torch.Tensor | None, vectors: bool,
                 hidden: bool | str, compact: bool, on_layer: Callable[[int], None] | None, logits: bool,
                 stop_after: int | None, past: Any, position_ids: torch.Tensor | None) -> ForwardOutput:
        layers = self.layers(model)
        with GATE.turn(), recording(vectors=vectors, gate=head_mask, hidden=hidden, only=stop_after,
                                    compact=compact, on_layer=on_layer) as rec:
            stop = None if stop_after is None else layers[stop_after].register_forward_hook(_stopper(rec))
            try:
                net = model if logits and stop is None else self.base(model)
                extra = {"token_type_ids": token_type_ids} if self.uses_token_types else {
                    "use_cache": past is not None, **({"past_key_values": past} if past is not None else {})}
                if position_ids is not None:
                    extra["position_ids"] = position_ids
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
                      score_softcap=rec.softcap.get(first), lm_logits=out.logits if logits and out is not None else None,
                      past=getattr(out, "past_key_values", None) if past is not None else None)
        if compact:
            return ForwardOutput(weights=[], values=None, mask=None, layer_masks=pick(rec.masks),
                                 layer_scales=pick(rec.scaling), layer_softcaps=pick(rec.softcap), **common)
        return ForwardOutput(weights=pick(rec.weights), values=pick(rec.values) if vectors else None,
                             mask=self._allowed(rec.masks[first], input_ids), **common)

    def _allowed(self, mask: torch.Tensor | None, input_ids: torch.Tensor) -> torch.Tensor:
        """The mask the first layer received as booleans. Shape: -> (batch, q_pos, k_pos), True = may attend."""
        if mask is not None:
            return allowed_from_mask(mask[:, 0])
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

