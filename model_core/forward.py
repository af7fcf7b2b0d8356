"""Run either model once on an encoded input and collect its AttentionTrace."""

from __future__ import annotations

import numpy as np
import torch

from model_core.encoder import TransformerForSequenceClassification
from model_core.encoding import EncodedInput
from model_core.loading import LoadedModel
from model_core.trace import AttentionTrace
from model_core.value_norms import value_norms


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float32).numpy()


def _input_fields(encoded: EncodedInput) -> dict:
    """The trace's fields that describe its input."""
    return dict(tokens=encoded.tokens, token_ids=encoded.input_ids[0].numpy().astype(np.int64),
                token_type_ids=encoded.token_type_ids[0].numpy().astype(np.int64),
                sentence_b_start=encoded.sentence_b_start)


def _head_mask_tensor(head_mask: np.ndarray | None, n_layers: int, n_heads: int, device: torch.device):
    if head_mask is None:
        return None
    hm = np.asarray(head_mask, dtype=np.float32)
    if hm.shape != (n_layers, n_heads):
        raise ValueError(f"head_mask has shape {hm.shape}; it must be (layer, head) = ({n_layers}, {n_heads}).")
    return torch.from_numpy(hm).to(device)


@torch.no_grad()
def trace_custom(
    model: TransformerForSequenceClassification,
    encoded: EncodedInput,
    description: str,
    head_mask: np.ndarray | None = None,
) -> AttentionTrace:
    """Run the from-scratch encoder and keep its tensors."""
    device = next(model.parameters()).device
    cfg = model.config
    gate = _head_mask_tensor(head_mask, cfg.num_hidden_layers, cfg.num_attention_heads, device)
    out = model(encoded.input_ids.to(device), encoded.token_type_ids.to(device), head_mask=gate)
    enc = out.encoder
    n_layers, n_heads = len(enc.layers), len(enc.layers[0].heads)

    def stack(pick) -> torch.Tensor:
        """One tensor of every head's ``pick``, copied once (a nested stack would copy it twice)."""
        flat = torch.stack([pick(h) for layer in enc.layers for h in layer.heads])  # (layer * head, ...)
        return flat.view(n_layers, n_heads, *flat.shape[1:])

    queries = stack(lambda h: h.query[0])  # (layer, head, pos, d_head)
    keys = stack(lambda h: h.key[0])
    values = stack(lambda h: h.value[0])
    weights = stack(lambda h: h.step.weights[0])  # (layer, head, q_pos, k_pos)
    n = encoded.input_ids.shape[1]
    mask = np.ones((n, n), dtype=bool) if enc.mask is None else _np(enc.mask[0]) > 0.5
    norms = value_norms(values, [layer.attention.output_linear.weight for layer in model.encoder.layers])
    return AttentionTrace(
        **_input_fields(encoded),
        attentions=_np(weights),
        mask=mask,
        queries=_np(queries),
        keys=_np(keys),
        values=_np(values),
        value_norms=_np(norms),
        hidden_states=_np(torch.stack([h[0] for h in enc.hidden_states])),
        model_kind="custom",
        causal=cfg.causal,
        description=description,
        logits=_np(out.logits[0]),
        head_mask=None if head_mask is None else np.asarray(head_mask, dtype=bool),
    )


@torch.no_grad()
def trace_bert(loaded: LoadedModel, encoded: EncodedInput, head_mask: np.ndarray | None = None) -> AttentionTrace:
    """Run ``transformers``' BertModel and keep its tensors.

    The pre-softmax scores are rebuilt exactly from the queries and keys, which forward hooks
    capture on the query and key projections. transformers 5 dropped BERT's ``head_mask``
    argument, so switching heads off is a hook on each self-attention that zeroes a head's
    output, as the old ``head_mask`` did by zeroing its weights.
    """
    model = loaded.model
    cfg = model.config
    n_layers, n_heads = cfg.num_hidden_layers, cfg.num_attention_heads
    d_head = cfg.hidden_size // n_heads
    gate = _head_mask_tensor(head_mask, n_layers, n_heads, loaded.device)
    captured: dict[tuple[int, str], torch.Tensor] = {}
    handles = []

    def keep(i: int, name: str):
        def hook(_module, _inputs, output):
            captured[(i, name)] = output[0].view(-1, n_heads, d_head).transpose(0, 1)  # (head, pos, d_head)
        return hook

    def gate_heads(i: int):
        def hook(_module, _inputs, output):
            context = output[0]  # (B, pos, hidden)
            scale = gate[i].repeat_interleave(d_head).to(context.dtype)
            return (context * scale, *output[1:])
        return hook

    try:
        for i, layer in enumerate(model.encoder.layer):
            for name in ("query", "key", "value"):
                handles.append(getattr(layer.attention.self, name).register_forward_hook(keep(i, name)))
            if gate is not None:
                handles.append(layer.attention.self.register_forward_hook(gate_heads(i)))
        out = model(
            input_ids=encoded.input_ids.to(loaded.device),
            token_type_ids=encoded.token_type_ids.to(loaded.device),
            output_attentions=True,
            output_hidden_states=True,
        )
    finally:
        for h in handles:
            h.remove()
    if not out.attentions or out.attentions[0] is None:
        raise RuntimeError("The model returned no attentions; it must be loaded with attn_implementation='eager'.")
    attentions = torch.stack([a[0] for a in out.attentions])  # (layer, head, q_pos, k_pos)
    if gate is not None:
        attentions = attentions * gate[:, :, None, None]
    pick = lambda name: torch.stack([captured[(i, name)] for i in range(n_layers)])  # noqa: E731
    values = pick("value")
    norms = value_norms(values, [layer.attention.output.dense.weight for layer in model.encoder.layer])
    n = encoded.input_ids.shape[1]
    return AttentionTrace(
        **_input_fields(encoded),
        attentions=_np(attentions),
        mask=np.ones((n, n), dtype=bool),
        queries=_np(pick("query")),
        keys=_np(pick("key")),
        values=_np(values),
        value_norms=_np(norms),
        hidden_states=_np(torch.stack([h[0] for h in out.hidden_states])),
        model_kind="bert",
        causal=False,
        description=loaded.description,
        logits=None,
        head_mask=None if head_mask is None else np.asarray(head_mask, dtype=bool),
    )
