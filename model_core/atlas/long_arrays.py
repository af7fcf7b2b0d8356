"""A long text's card pass (``model_core.atlas.shard.LONG_FROM`` tokens or more): what the QK split
(``qk_fast.TextSplit``) and the direct logit effect (``why.direct_effects``) read, without any layer's n x n pattern.

A short text's card pass keeps its full trace (``why.TextArrays``: every layer's weights, 18 GB for SmolLM2 at 4,096
tokens). Both readers need of the weights only each head's output before W_O, ``z = Σ_j a_ij v_j``. Here the text
runs alone through the compact pass (sdpa, keeping queries, keys and the residual stream), and each layer's z is made
in blocks of query rows from the same score kernel the compact trace uses, with each layer's values taken from its
input: ``v = norm(x) W_V + b_V``, the norm before attention at its own statistics (the models ``qk_fast`` serves are
pre-norm). What is kept is O(layer · head · pos · d_head): about 1.2 GB for SmolLM2 at 4,096 tokens, on the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from model_core.atlas.shard import weight_blocks
from model_core.compact.build import layer_masks_of
from model_core.compact.trace import QUERY_BLOCK
from model_core.corpus.batches import EncodedText
from model_core.corpus.model import LoadedCorpusModel
from model_core.families.weights import LayerWeights, layer_weights
from model_core.gate import GATE
from model_core.qk.frozen import inv_scale


class PerQueryHead:
    """A (layer, kv_head, pos, d_head) array read as (layer, head, ...): ``[layer, head]`` is its key/value head's."""

    def __init__(self, kv_array: np.ndarray, kv_of_head: np.ndarray) -> None:
        self.kv_array, self.kv_of_head = kv_array, kv_of_head

    def __getitem__(self, index: tuple[int, int]) -> np.ndarray:
        layer, head = index
        return self.kv_array[layer, int(self.kv_of_head[head])]


@dataclass(frozen=True, eq=False)
class LongArrays:
    """What ``TextSplit`` and ``direct_effects`` read of a long text (``why.TextArrays``'s names, z for the weights
    and values).

    Shape: queries, z (layer, head, pos, d_head); kv_keys (layer, kv_head, pos, d_head), after the rotary embedding;
    kv_of_head (head,); hidden_states (layer + 1, pos, d_model); token_ids, token_type_ids (pos,).
    """

    token_ids: np.ndarray
    token_type_ids: np.ndarray
    queries: np.ndarray
    kv_keys: np.ndarray
    kv_of_head: np.ndarray
    z: np.ndarray
    hidden_states: np.ndarray

    @property
    def keys(self) -> PerQueryHead:
        return PerQueryHead(self.kv_keys, self.kv_of_head)


def values_of(lw: LayerWeights, x: torch.Tensor) -> torch.Tensor:
    """A pre-norm layer's values from its input: ``norm(x) W_V + b_V``. Shape: x (pos, d_model) -> (kv_head, pos,
    d_head), float32."""
    x = x.float()
    normed = (x - x.mean(-1, keepdim=True) if lw.ln1_kind == "layer" else x) * inv_scale(lw, x)
    if lw.ln1_w is not None:
        normed = normed * lw.ln1_w.float()
    if lw.ln1_b is not None:
        normed = normed + lw.ln1_b.float()
    v = torch.einsum("nm,kmd->knd", normed, lw.W_V.float())
    return v if lw.b_V is None else v + lw.b_V.float()[:, None, :]


@torch.inference_mode()
def long_text_arrays(loaded: LoadedCorpusModel, text: EncodedText, block: int = QUERY_BLOCK) -> LongArrays:
    """One long text's ``LongArrays``: the compact pass, then each layer's z in blocks of ``block`` query rows
    (O(head · block · pos) at a time), copied to the host layer by layer."""
    family, module = loaded.family, loaded.module
    dev = next(module.parameters()).device
    ids = torch.tensor([text.ids], dtype=torch.long, device=dev)
    types = torch.tensor([text.types], dtype=torch.long, device=dev)
    n = len(text.ids)
    with GATE.turn():  # the pass and its copy to the host, as one turn of the route's gate
        out = family.forward(module, ids, types, None, vectors=True, hidden=True, compact=True)
        masks, mask_of_layer = layer_masks_of(out.layer_masks, n, family.is_decoder)
        kv_of_head = np.asarray(family.kv_heads(module.config), dtype=np.int64)
        kv = torch.as_tensor(kv_of_head, device=dev)
        host = lambda t: t.to("cpu", torch.float32).numpy()  # noqa: E731
        queries, keys, zs = [], [], []
        for layer, lw in enumerate(layer_weights(module)):
            q, k = out.queries[layer][0], out.keys[layer][0]  # (head, pos, d_head), (kv_head, pos, d_head)
            out.queries[layer] = out.keys[layer] = None
            v = values_of(lw, out.hidden[layer][0]).index_select(0, kv)  # each query head's values
            z = torch.empty(q.shape[0], n, v.shape[-1], dtype=torch.float32, device=dev)
            for rows, w in weight_blocks(q, k.index_select(0, kv), masks[mask_of_layer[layer]],
                                         out.layer_scales[layer], out.layer_softcaps[layer], block):
                z[:, rows] = w @ v[:, :w.shape[-1]]
            queries.append(host(q))
            keys.append(host(k))
            zs.append(host(z))
        hidden = np.stack([host(t[0]) for t in out.hidden])
        del out
    return LongArrays(np.asarray(text.ids, dtype=np.int64), np.asarray(text.types, dtype=np.int64),
                      np.stack(queries), np.stack(keys), kv_of_head, np.stack(zs), hidden)

