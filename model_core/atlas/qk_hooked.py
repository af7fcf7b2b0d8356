"""The QK split above the row mean (``model_core.atlas.why``) of many heads of one text, from **one** hooked pass:
the models ``model_core.atlas.qk_fast`` does not serve from a trace (the encoders: post-LN BERT/MiniLM, whose
LayerNorms sit after each sum, and the chapter-3 encoder, whose embeddings are normed).

``model_core.qk``'s pass gathers the parts of one layer's input for one head, and projects them on that head's query
and key at every position: a whole model run per head. Here the parts are gathered once per text, as whole vectors
(every norm before the layer frozen at its actual statistics, as ``model_core.qk.gather`` freezes them), and each
wanted layer's heads are split when the pass reaches that layer's input. A split needs two numbers per component,
both linear in it, so the model's own query and key (from the trace) are pulled back onto the residual stream once,
as ``qk_fast`` does:

    query side  Q_c · u = inv_i (x_c[i] ⊙ g) · (W_Q u),                       u = k_j − mean_j' k_j'
    key side    Σ_j' w_j' q_i · K_c[j'] = Σ_j' w_j' inv_j' (x_c[j'] ⊙ g) · (W_K q_i),   w = δ_j − 1/|keys|

with g and inv the pre-norm's gain (LayerNorm: centring) and frozen 1/σ, or 1 and the identity where the layer's
input is already normed (post-LN). The constant parts (the normed sums' β, b_O) are one part, ``bias``, with b_Q, b_K
and the pre-norm's β. A test holds the result equal to ``model_core.qk``'s split.

Serves models without a rotary embedding and without query/key or output norms on the heads (``supported``); the
whole parts of a layer are (component, position, d_model) float64, so a text whose top layer's parts would pass
``MAX_PARTS_BYTES`` takes ``model_core.qk``'s pass per head instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from model_core.atlas.qk_fast import constants
from model_core.families.hooked import run_with_hooks
from model_core.families.weights import layer_weights
from model_core.qk.frozen import CPU, on_cpu, sum_tolerance, window
from model_core.qk.gather import PartsPass

F64 = torch.float64
MAX_PARTS_BYTES = 256 * 2**20
"""The most the whole parts of a text's top wanted layer may take (float64)."""

Item = tuple[int, int, int, int]
"""(layer, head, query, key)."""


def supported(model: Any, family: Any) -> bool:
    """Whether the split can be taken this way: no rotary embedding, no per-head query/key or output norm."""
    if family.position_embeddings(model, 0, 2) is not None:
        return False
    return all(lw.q_norm_w is None and lw.k_norm_w is None and lw.out_norm_w is None for lw in layer_weights(model))


def fits(model: Any, family: Any, n: int, top_layer: int) -> bool:
    """Whether the whole parts of layer ``top_layer``'s input at ``n`` positions stay under ``MAX_PARTS_BYTES``."""
    cfg = model.config
    components = 3 + top_layer * (family.n_heads(cfg) + 1)
    return components * n * int(getattr(cfg, "hidden_size", 0) or getattr(cfg, "dim", 0) or 1) * 8 <= MAX_PARTS_BYTES


class TextPass(PartsPass):
    """One hooked pass over a text that splits each item's score at its layer's input as the pass reaches it.

    ``on_split(item, query_side, key_side)`` is called for every item, with (component,) float64 arrays in
    ``component_names`` order (``bias`` last where the layer has a constant term).
    """

    def __init__(self, model: Any, family: Any, trace: Any, items: list[Item],
                 on_split: Callable[[Item, np.ndarray, np.ndarray], None]) -> None:
        n = int(np.asarray(trace.token_ids).shape[0])
        weights = layer_weights(model)
        top = max(layer for layer, *_ in items)
        self._setup(model, family, weights[top], top, 0, n, at=CPU)  # the atlas's splits run on the host
        self.whole = True
        self.trace, self.on_split = trace, on_split
        self._by_layer: dict[int, list[Item]] = {}
        for item in items:
            self._by_layer.setdefault(item[0], []).append(item)
        self._layer_weights = [on_cpu(w) for w in weights[:top + 1]]
        names = self._names() + [f"blocks.{layer}.hook_resid_pre" for layer in sorted(self._by_layer) if layer]
        ids = torch.tensor(np.array(trace.token_ids), dtype=torch.long)[None]
        types = getattr(trace, "token_type_ids", None)
        types = None if types is None else torch.tensor(np.array(types), dtype=torch.long)[None]
        with torch.no_grad():
            run_with_hooks(model, ids, hooks=[(name, self._reader(name)) for name in dict.fromkeys(names)],
                           token_type_ids=types)

    def _take(self, name: str, t: torch.Tensor) -> None:
        super()._take(name, t)
        if name.endswith("hook_resid_pre"):
            layer = int(name.split(".")[1])
            if layer in self._by_layer:
                self._split_layer(layer, t)

    def _split_layer(self, layer: int, resid: torch.Tensor) -> None:
        lw = self._layer_weights[layer]
        parts = torch.stack(self.parts_full + ([self.bias_full] if self.bias_full is not None else []))
        err = float((parts.sum(0) - resid).abs().max())
        if err > sum_tolerance(lw.W_Q.dtype) * max(1.0, float(resid.abs().max())):
            raise RuntimeError(f"The parts of layer {layer}'s input do not sum to it (off by {err:.2e}).")
        pre = lw.ln1_kind is not None and not self.post
        if pre:  # the norm before attention, frozen at the whole residual
            var = resid.var(-1, unbiased=False) if lw.ln1_kind == "layer" else resid.pow(2).mean(-1)
            inv = torch.rsqrt(var + lw.ln1_eps)  # (n,)
            gain = torch.ones(resid.shape[-1], dtype=F64) if lw.ln1_w is None else lw.ln1_w.to(F64)
        else:
            inv, gain = torch.ones(self.n, dtype=F64), torch.ones(resid.shape[-1], dtype=F64)
        centred = pre and lw.ln1_kind == "layer"
        win = window(self.model, layer)
        has_const_part = self.bias_full is not None
        for item in self._by_layer[layer]:
            _, head, query, key = item
            kv = int(lw.kv_of_head[head])
            if self.decoder:
                visible = [j for j in range(query + 1) if win is None or query - j < win]
            else:
                visible = list(range(self.n))
            keys = torch.from_numpy(np.array(self.trace.keys[layer, head], dtype=np.float64))[visible]
            q = torch.from_numpy(np.array(self.trace.queries[layer, head, query], dtype=np.float64))
            at = visible.index(key)
            u = keys[at] - keys.mean(0)
            w_bar = torch.full((len(visible),), -1.0 / len(visible), dtype=F64)
            w_bar[at] += 1.0

            def pulled(w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:  # (d_head,) -> (d_model,)
                out = (v @ w.to(F64).T) * gain
                return out - out.mean(-1, keepdim=True) if centred else out

            a = pulled(lw.W_Q[head], u) * inv[query]  # (d_model,)
            b = pulled(lw.W_K[kv], q)[None] * (w_bar * inv[visible])[:, None]  # (keys, d_model)
            query_side = parts[:, query] @ a  # (C,): the components, then the constant part if any
            key_side = torch.einsum("cjd,jd->c", parts[:, visible], b)
            q_const, k_const = constants(lw, head, kv, pre)
            consts = lw.b_Q is not None or lw.b_K is not None or (pre and lw.ln1_b is not None)
            if consts:
                q_bias = q_const @ u
                k_bias = w_bar.sum() * (k_const @ q)
                if has_const_part:
                    query_side[-1] += q_bias
                    key_side[-1] += k_bias
                else:
                    query_side = torch.cat([query_side, q_bias[None]])
                    key_side = torch.cat([key_side, k_bias[None]])
            self.on_split(item, (query_side * lw.scale).numpy(), (key_side * lw.scale).numpy())
