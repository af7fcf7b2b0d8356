"""The QK split above the row mean (``model_core.atlas.why``) for many heads of one text, without a pass per head.

``model_core.qk`` builds every component's share of one head's query and key at every position (a pass per head,
and a (d_model, d_model)-sized fold of each earlier layer's W_O per head): about 2 s a head at SmolLM2's layer 29
on two cores, whatever the text's length. The atlas needs only two numbers per component and context, and both are
linear in the component, so it takes the model's own query and key at the context and pulls them back onto the
residual stream once (the rotary embedding is a rotation: ``R_j q · k = q · R_j^T k``):

    query side  Q_c · u       = inv_i (x_c[i] ⊙ g) · (W_Q R_i^T u),      u = k_j − mean_j' k_j'
    key side    Σ_j' w_j' q_i · K_c[j'] = Σ_j' w_j' inv_j' (x_c[j'] ⊙ g) · (W_K R_j'^T q_i),  w = δ_j − 1/|keys|

with x_c the component's vector (each head's write ``z W_O``, each MLP's output, the embeddings), g the gain of the
norm before attention (a LayerNorm also centres), inv its frozen 1/rms or 1/σ, and the constant terms (LayerNorm's
β, b_Q, b_K, earlier b_O) in ``bias``, as ``model_core.qk`` splits them. Each head's write at every position is made
once per text. A test holds the result equal to ``model_core.qk``'s split.

It serves pre-norm models whose embeddings are not normed and whose heads have no query/key or output norm (GPT-2,
Llama, Qwen2, Mistral, Phi, SmolLM2); ``supported`` says so, and the others take ``model_core.qk``'s pass.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from model_core.families.hook_attention import apply_rotary
from model_core.families.weights import layer_weights
from model_core.gate import GATE
from model_core.qk.frozen import inv_scale, on_cpu, window

F64 = torch.float64


def supported(model: Any, family: Any) -> bool:
    """Whether this model's split can be taken this way (the module's docstring)."""
    if not family.is_decoder or family.parts(model, 0).post_norm:
        return False
    embed = family.embed_parts(model)
    if embed.norm is not None or embed.type_embed is not None:
        return False
    return all(lw.ln1_kind is not None and lw.q_norm_w is None and lw.k_norm_w is None and lw.out_norm_w is None
               for lw in layer_weights(model))


def _t(array: Any) -> torch.Tensor:
    return torch.from_numpy(np.array(array, dtype=np.float64))


def constants(lw: Any, head: int, kv: int, pre_norm: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The constant parts of a head's query and key before the rotary embedding: the pre-norm's β through W_Q / W_K
    (``pre_norm``), b_Q and b_K. Shape: -> (d_head,), (d_head,) float64 (zeros where the model has none)."""
    q_const = torch.zeros(lw.W_Q.shape[-1], dtype=F64)
    k_const = torch.zeros(lw.W_K.shape[-1], dtype=F64)
    if pre_norm and lw.ln1_b is not None:
        q_const = q_const + lw.ln1_b.to(F64) @ lw.W_Q[head].to(F64)
        k_const = k_const + lw.ln1_b.to(F64) @ lw.W_K[kv].to(F64)
    if lw.b_Q is not None:
        q_const = q_const + lw.b_Q[head].to(F64)
    if lw.b_K is not None:
        k_const = k_const + lw.b_K[kv].to(F64)
    return q_const, k_const


class HostWeights:
    """A model's layer weights on the host (``on_cpu``), each layer copied the first time it is read: one copy a
    layer for an atlas run, shared by its texts' ``TextSplit`` (on a GPU an 8B model's attention weights are 2.7 GB in
    bfloat16; on the CPU these are the model's own tensors). Supports ``[layer]``, ``[:layer]`` and ``len``."""

    def __init__(self, model: Any) -> None:
        self._weights = layer_weights(model)  # views of the model's parameters, where the model is
        self._host: dict[int, Any] = {}

    def __len__(self) -> int:
        return len(self._weights)

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        index = range(len(self))[index]
        if index not in self._host:
            self._host[index] = on_cpu(self._weights[index])
        return self._host[index]


class TextSplit:
    """One text's trace, ready to split any head's score at any (query, key) above the row mean.

    ``trace``: a full trace's arrays (``why.TextArrays``) or a long text's (``long_arrays.LongArrays``, z in place of
    the weights and values). Only one layer's parts are held at a time (``split_many``), in float64.
    """

    CHUNK_BYTES = 768 * 2**20
    """The most the key-side maps of the contexts split together may take (float64 (keys, d_model) each)."""

    def __init__(self, model: Any, family: Any, trace: Any, weights: HostWeights | None = None) -> None:
        self.model, self.family, self.trace = model, family, trace
        self.weights = HostWeights(model) if weights is None else weights  # an atlas run passes its one
        first = self.hidden(0)
        self.n = first.shape[0]
        self.n_heads = int(trace.queries.shape[1])
        self._rope: dict[int, Any] = {}
        self._inv: dict[int, torch.Tensor] = {}
        embed = family.embed_parts(model)
        self.embeds = [first]
        if embed.pos_embed is not None:  # absolute positions: the token embedding, the rest is ``pos``
            ids = torch.as_tensor(np.array(trace.token_ids), dtype=torch.long,
                                  device=next(model.parameters()).device)
            with GATE.turn(), torch.no_grad():
                tok = embed.embed(ids).to("cpu", F64)
            self.embeds = [tok, first - tok]

    def hidden(self, layer: int) -> torch.Tensor:
        """The residual stream at layer ``layer``'s input. Shape: (n, d_model) float64."""
        return _t(self.trace.hidden_states[layer])

    def _z(self, layer: int) -> torch.Tensor:
        """Each head's output before W_O. Shape: (head, n, d_head) float64."""
        z = getattr(self.trace, "z", None)
        if z is not None:
            return _t(z[layer])
        return torch.matmul(_t(self.trace.weights[layer]), _t(self.trace.values[layer]))

    def layer_parts(self, layer: int) -> torch.Tensor:
        """Layer ``layer``'s components: each head's write, then the MLP's output. Shape: (head + 1, n, d_model)."""
        lw = self.weights[layer]
        writes = torch.einsum("hnd,hdm->hnm", self._z(layer), lw.W_O.to(F64))  # (head, n, d_model)
        attn_out = writes.sum(0) + (0 if lw.b_O is None else lw.b_O.to(F64))
        mlp = self.hidden(layer + 1) - self.hidden(layer) - attn_out
        return torch.cat([writes, mlp[None]])

    def _rotary(self, layer: int) -> Any:
        if layer not in self._rope:
            with GATE.turn():  # the model's rotary module (a dynamic one updates itself by length)
                rope = self.family.position_embeddings(self.model, layer, self.n)
            self._rope[layer] = None if rope is None else tuple(t[0].detach().to("cpu", F64) for t in rope)
        return self._rope[layer]

    def _unrotate(self, layer: int, vectors: torch.Tensor, positions: list[int]) -> torch.Tensor:
        """``R_p^T v`` for each vector v (rows) at its position p. Shape: (m, d_head) -> (m, d_head)."""
        rope = self._rotary(layer)
        if rope is None:
            return vectors
        cos, sin = (t[positions][None] for t in rope)  # (1, m, d_head)
        attn = self.family.parts(self.model, layer).attn
        x = vectors[None, None]  # (1, 1, m, d_head)
        return apply_rotary(attn, x, x, (cos, -sin))[0][0, 0]  # a rotation's inverse: the angle negated

    def _maps(self, layer: int, head: int, query: int, key: int, has_bias: bool) -> dict[str, Any]:
        """What one context's split contracts each component with: ``a`` (d_model,) on the query side, ``b``
        (keys, d_model) over the visible keys ``keys_at`` on the key side, and the constant terms."""
        lw = self.weights[layer]
        kv = int(lw.kv_of_head[head])
        win = window(self.model, layer)
        visible = [j for j in range(query + 1) if win is None or query - j < win]
        keys = _t(self.trace.keys[layer, head])[visible]  # (keys, d_head), after the rotary embedding
        q = _t(self.trace.queries[layer, head, query])  # (d_head,)
        u = keys[visible.index(key)] - keys.mean(0)
        w_bar = torch.full((len(visible),), -1.0 / len(visible), dtype=F64)
        w_bar[visible.index(key)] += 1.0
        gain = torch.ones(lw.W_Q.shape[1], dtype=F64) if lw.ln1_w is None else lw.ln1_w.to(F64)
        centred = lw.ln1_kind == "layer"

        def pulled(w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:  # (.., d_head) -> (.., d_model): norm's map^T
            out = (v @ w.to(F64).T) * gain
            return out - out.mean(-1, keepdim=True) if centred else out

        if layer not in self._inv:  # every context of the layer reads the same frozen scales
            self._inv[layer] = inv_scale(lw, self.hidden(layer)).squeeze(-1)  # (n,)
        inv = self._inv[layer]
        u_back = self._unrotate(layer, u[None], [query])[0]  # R_i^T u
        a = pulled(lw.W_Q[head], u_back) * inv[query]  # (d_model,)
        r = self._unrotate(layer, q.expand(len(visible), -1).clone(), visible)  # (keys, d_head): R_j^T q
        b = pulled(lw.W_K[kv], r) * (w_bar * inv[visible])[:, None]  # (keys, d_model)
        out = {"a": a, "b": b, "keys_at": slice(visible[0], visible[-1] + 1), "bias": None}
        if has_bias:  # the visible keys are one run of positions: ``keys_at`` is a view, no copy
            b_o = sum((w.b_O.to(F64) for w in self.weights[:layer] if w.b_O is not None), torch.zeros_like(gain))
            q_const, k_const = constants(lw, head, kv)
            out["bias"] = (b_o @ a + q_const @ u_back, (b @ b_o).sum() + (w_bar[:, None] * r).sum(0) @ k_const)
        return out

    def split(self, layer: int, head: int, query: int, key: int, has_bias: bool) -> tuple[np.ndarray, np.ndarray]:
        """The query-side and key-side components of the score above the row mean at (query, key).

        Shape: -> (component,), (component,) float64 (``bias`` last where ``has_bias``).
        """
        return next(self.split_many([(layer, head, query, key)], [has_bias]))[1]

    def split_many(self, items: list[tuple[int, int, int, int]], has_bias: list[bool]
                   ) -> Iterator[tuple[tuple[int, int, int, int], tuple[np.ndarray, np.ndarray]]]:
        """``split`` of every (layer, head, query, key) of ``items``, yielded as (item, its split) layer by layer
        (earliest first), each layer's parts made once for every context of a chunk: the contexts are taken in layer
        order, in chunks whose key-side maps fit ``CHUNK_BYTES``, so a chunk of early layers makes only their parts.
        Each chunk's results come as it ends, so a caller can report progress, or stop, between chunks."""
        per_chunk = max(1, self.CHUNK_BYTES // (8 * self.n * self.trace.hidden_states.shape[-1]))  # B's (n, d_model)
        order = sorted(range(len(items)), key=lambda i: items[i][0])
        for start in range(0, len(order), per_chunk):
            chunk = order[start:start + per_chunk]
            yield from self._split_chunk([items[j] for j in chunk], [has_bias[j] for j in chunk])

    def _split_chunk(self, items: list[tuple[int, int, int, int]], has_bias: list[bool]
                     ) -> list[tuple[tuple[int, int, int, int], tuple[np.ndarray, np.ndarray]]]:
        """One chunk (``items`` in layer order): every context's maps stacked, A (m, d_model) and B (m, n, d_model),
        B zero outside the context's visible keys, so that each source layer's parts are read once, in one matrix
        product for the key sides of the contexts it feeds (``take``), not once a context."""
        m, d_model = len(items), self.trace.hidden_states.shape[-1]
        a_all = torch.empty(m, d_model, dtype=F64)
        b_all = torch.zeros(m, self.n, d_model, dtype=F64)
        biases = []
        for i, (item, bias) in enumerate(zip(items, has_bias)):
            maps = self._maps(*item, bias)
            a_all[i], b_all[i, maps["keys_at"]] = maps["a"], maps["b"]
            biases.append(maps["bias"])
        layers = [la for la, *_ in items]
        queries = torch.as_tensor([q for _, _, q, _ in items])
        q_sides: list[list[torch.Tensor]] = [[] for _ in items]
        k_sides: list[list[torch.Tensor]] = [[] for _ in items]

        def take(group: torch.Tensor, below: int) -> None:  # group: (count, n, d_model) of the layers below ``below``
            first = bisect.bisect_left(layers, below)  # the contexts it feeds: a suffix, the items in layer order
            if first == m:
                return
            keys = group.reshape(len(group), -1) @ b_all[first:].reshape(m - first, -1).T  # (count, m - first)
            at_query = torch.einsum("cmd,md->cm", group[:, queries[first:]], a_all[first:])
            for i in range(first, m):
                q_sides[i].append(at_query[:, i - first])
                k_sides[i].append(keys[:, i - first])

        take(torch.stack(self.embeds), 0)
        for source in range(layers[-1]):
            take(self.layer_parts(source), source + 1)
        results = []
        for (layer, *rest), bias, qs, ks in zip(items, biases, q_sides, k_sides):
            query_side, key_side = torch.cat(qs), torch.cat(ks)
            if bias is not None:
                query_side = torch.cat([query_side, bias[0][None]])
                key_side = torch.cat([key_side, bias[1][None]])
            scale = self.weights[layer].scale
            results.append(((layer, *rest), ((query_side * scale).numpy(), (key_side * scale).numpy())))
        return results
