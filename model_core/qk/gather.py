"""The parts of a layer's input at every position, gathered by one hooked pass or rebuilt from a full trace, turned
into each part's share of the focused head's query (at the query position) and key (at every position), every norm
frozen at its actual statistics. ``model_core.qk.terms`` builds the QK split from them."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from model_core.families.hook_attention import apply_rotary
from model_core.families.hooked import run_with_hooks
from model_core.families.weights import LayerWeights, layer_weights
from model_core.gate import GATE
from model_core.kernel import apply_mask, attention_scores, weights_from_scores
from model_core.qk.frozen import (
    frozen_ln,
    inv_scale,
    model_softcap,
    on,
    split_device,
    sum_tolerance,
    tensor,
    window,
)

COMPACT_FROM = 1024
"""From this many tokens the pass attends with sdpa and never forms the n x n pattern; the weight of a key is then
computed from the layer's queries and keys (causal rows; a sliding window is applied where the layer has one)."""


class PartsPass:
    """One hooked pass that gathers the parts of layer ``layer``'s input, and each one's share of head ``head``'s
    query and key at every position (``Q_all``, ``K``); ``query`` picks the query position the answers read."""

    def __init__(self, model: Any, family: Any, lw: LayerWeights, layer: int, head: int, input_ids: torch.Tensor,
                 token_type_ids: torch.Tensor | None) -> None:
        n = int(input_ids.shape[1])
        self._setup(model, family, lw, layer, head, n)
        names = self._names()
        compact = self.decoder and n >= COMPACT_FROM
        hooks = [(name, self._reader(name)) for name in names]
        with torch.no_grad():
            out = run_with_hooks(model, input_ids, hooks=hooks, names=[f"blocks.{layer}.attn.hook_q",
                                                                      f"blocks.{layer}.attn.hook_k"],
                                 compact=compact, keep_rope=True, token_type_ids=token_type_ids)
        self.rope = (out.rope or {}).get(layer)
        b = f"blocks.{layer}.attn"
        self.q_model = out.cache[f"{b}.hook_q"][0, :, head].to(self.at, torch.float64)  # (n, d_head) after rope
        k_all = out.cache[f"{b}.hook_k"][0].to(self.at, torch.float64)
        self.k_model = k_all[:, self.kv] if k_all.shape[1] == lw.n_kv_heads else k_all[:, head]
        self.scale = lw.scale  # the model's own (tests check the weights it gives against the model's pattern)
        self.softcap = model_softcap(out.output, layer)
        self.window = window(model, layer)
        self._finish()

    def _setup(self, model: Any, family: Any, lw: LayerWeights, layer: int, head: int, n: int,
               at: torch.device | None = None) -> None:
        # The split runs in float64 on the model's device (the CPU for one without float64: ``split_device``), or on
        # ``at``; a trace's host arrays are copied there, and the weights too where the split runs elsewhere.
        self.at = split_device(model) if at is None else at
        self.model, self.family, self.lw, self.layer, self.head = model, family, on(lw, self.at), layer, head
        self.query = n - 1  # the position ``Q`` and the answers read; callers set it
        self.n = n
        # the projections' precision: float64 on short texts (the exactness tests); float32 from 256 tokens, where
        # the products are most of the time
        self._dtype = torch.float64 if n < 256 else torch.float32
        self.kv = lw.kv_of_head[head]
        self.decoder = family.is_decoder
        self.post = family.parts(model, 0).post_norm or lw.ln1_kind is None
        self.whole = self.post  # parts kept as whole vectors (a subclass may keep them so for a pre-norm model)
        self.positions = list(range(n))  # parts are kept at every position (pair: projected, so cheap)
        self.embed = family.embed_parts(model)
        self.parts_full: list[torch.Tensor] = []  # post-norm models: (npos, d_model) float64 per component
        self.bias_full: torch.Tensor | None = None
        self.q_parts: list[torch.Tensor] = []  # pre-norm: each component's query-side projection at i, (d_head,)
        self.k_parts: list[torch.Tensor] = []  # pre-norm: key-side projection at every position, (n, d_head)
        self.q_bias = None
        self.k_bias = None
        self.embed_stage: dict[str, torch.Tensor] = {}
        self._weights = [on(w, self.at) for w in layer_weights(model)[:layer]]  # the earlier layers'

    # -- from a full trace, without a pass ----------------------------------------------------------------
    @classmethod
    def from_trace(cls, model: Any, family: Any, lw: LayerWeights, layer: int, head: int, trace: Any
                   ) -> PartsPass | None:
        """The same parts built from a full trace's pattern, values and residual stream and the model's weights: no
        model run. Each earlier head's write is ``(a @ v) W_O`` at every position, each MLP's output is what its
        block added beyond attention (``resid_post - resid_pre - attn_out``), so the parts sum to the layer's input
        exactly. Serves pre-norm models whose embeddings are not normed (the decoders); None elsewhere (post-LN
        encoders, a compact trace), where the hooked pass (``PartsPass``) answers. Heads switched off in the trace
        wrote nothing (their pattern is zero), so the split is of the model the trace shows."""
        weights = getattr(trace, "weights", None)
        if weights is None or getattr(trace, "values", None) is None:
            return None
        n = int(np.asarray(trace.token_ids).shape[0])
        self = cls.__new__(cls)
        self._setup(model, family, lw, layer, head, n)
        if self.post or self.embed.norm is not None or self.embed.type_embed is not None:
            return None
        with GATE.turn():  # the model's rotary module (a dynamic one updates itself by length)
            self.rope = family.position_embeddings(model, layer, n)
        with torch.no_grad():
            self._parts_from_trace(trace)
        self.q_model = self._host(trace.queries[layer, head])  # (n, d_head) after rope
        self.k_model = self._host(trace.keys[layer, head])  # this query head's key
        self.scale = lw.scale
        self.softcap = getattr(trace, "score_softcap", None)
        self.window = window(model, layer)
        self._finish()
        return self

    def _host(self, array: Any) -> torch.Tensor:
        """A trace's host array in float64 where the split computes."""
        return tensor(array).to(self.at, torch.float64)

    def _parts_from_trace(self, trace: Any) -> None:
        device = next(self.model.parameters()).device
        hidden = trace.hidden_states
        first = tok = self._host(hidden[0])
        if self.embed.pos_embed is not None:  # absolute positions: the token embedding, the rest is ``pos``
            ids = torch.as_tensor(np.array(trace.token_ids), dtype=torch.long, device=device)
            with GATE.turn():
                tok = self.embed.embed(ids).to(self.at, torch.float64)
            self._add_part(tok)
        self._add_part(first if tok is first else first - tok)
        for l in range(self.layer):
            z = torch.matmul(*(tensor(a).to(self.at) for a in (trace.weights[l], trace.values[l])))  # (head, n, d_head)
            attn_out = self._heads_from_z(l, z)
            self._add_part(self._host(hidden[l + 1]) - self._host(hidden[l]) - attn_out)  # the MLP
        self.resid = self._host(hidden[self.layer])

    def _heads_from_z(self, layer: int, z: torch.Tensor) -> torch.Tensor:
        """Layer ``layer``'s heads as components from their outputs ``z`` (head, n, d_head), pre-norm models: each
        head's write ``z W_O`` taken straight to the focused head's query and key (W_O folded into the norm's gain,
        its centring and W_Q / W_K: no (head, n, d_model) tensor); then b_O as a constant. Returns the attention's
        output as it joins the residual stream (Gemma 2/3: after its norm), (n, d_model) float64."""
        lw_l = self._weights[layer]
        w_o = lw_l.W_O.double()  # (head, d_head, d_model)
        attn_out = torch.einsum("hnd,hdm->nm", z.double(), w_o)
        b_o = None if lw_l.b_O is None else lw_l.b_O.double()
        if b_o is not None:
            attn_out = attn_out + b_o
        inv = None
        if lw_l.out_norm_w is not None:  # Gemma 2/3: the post-attention norm, frozen at the attention's output
            inv = torch.rsqrt(attn_out.pow(2).mean(-1, keepdim=True) + lw_l.out_norm_eps)  # (n, 1)
            out_w = lw_l.out_norm_w.double()
            w_o = w_o * out_w
            attn_out = attn_out * inv * out_w
        fold = (w_o @ self._norm_qk).to(self._dtype)  # (head, d_head, 2 d_head)
        proj = torch.matmul(z.to(self._dtype), fold).double()  # (head, n, 2 d_head)
        if inv is not None:
            proj = proj * inv
        d = self.lw.d_head
        self.q_parts.extend(proj[..., :d].unbind(0))
        self.k_parts.extend(proj[..., d:].unbind(0))
        if b_o is not None and inv is None:
            self._add_bias(b_o.expand(self.n, -1))
        return attn_out

    @functools.cached_property
    def _norm_qk(self) -> torch.Tensor:
        """The norm's linear map (its gain; LayerNorm: centring) then W_Q and W_K of the focused head, as one matrix
        (one product gives both sides). Shape: (d_model, 2 d_head) float64."""
        lw = self.lw
        w = torch.cat([lw.W_Q[self.head], lw.W_K[self.kv]], dim=-1).double()
        if lw.ln1_w is not None:
            w = w * lw.ln1_w.double()[:, None]
        if lw.ln1_kind == "layer":  # centring folded into the map: x - mean(x) = x (I - 11ᵀ/d)
            w = w - w.mean(0, keepdim=True)
        return w

    # -- gathering -------------------------------------------------------------------------------------
    def _names(self) -> list[str]:
        names = ["hook_embed"]
        if self.embed.pos_embed is not None:
            names.append("hook_pos_embed")
        if self.embed.type_embed is not None:
            names.append("hook_token_type_embed")
        names.append("blocks.0.hook_resid_pre")
        for l in range(self.layer):
            b = f"blocks.{l}"
            if self.post:  # post-LN: every part whole, frozen at each LayerNorm in turn
                names += [f"{b}.attn.hook_result", f"{b}.hook_mlp_out", f"{b}.hook_resid_mid", f"{b}.hook_mlp_in"]
            elif self.whole:  # pre-norm, parts kept whole: each head's write
                names += [f"{b}.attn.hook_result", f"{b}.hook_mlp_out"]
            else:  # pre-norm: each head's z, its write folded straight into the query and key
                names += [f"{b}.attn.hook_z", f"{b}.hook_mlp_out"]
        return names + ([f"blocks.{self.layer}.hook_resid_pre"] if self.layer else [])

    def _reader(self, name: str):
        def read(t: torch.Tensor, _point: Any) -> None:
            self._take(name, t[0].detach().to(self.at, torch.float64))
        return read

    def _take(self, name: str, t: torch.Tensor) -> None:
        if name in ("hook_embed", "hook_pos_embed", "hook_token_type_embed"):
            self.embed_stage[name] = t
            return
        if name.endswith("hook_resid_pre"):
            if name == "blocks.0.hook_resid_pre":
                self._embeddings_done(t)
            if name == f"blocks.{self.layer}.hook_resid_pre":
                self.resid = t
            return
        layer = int(name.split(".")[1])
        lw_l = self._weights[layer]
        if name.endswith("hook_z"):  # (n, head, d_head), pre-norm models
            self._heads_from_z(layer, t.transpose(0, 1))
        elif name.endswith("hook_result"):  # (n, head, d_model), post-LN models: each head's write, then b_O
            self._add_parts(t.transpose(0, 1))  # (head, n, d_model)
            if lw_l.b_O is not None:
                self._add_bias(lw_l.b_O.double().expand(self.n, -1))
        elif name.endswith("hook_resid_mid"):  # post-LN: the LayerNorm after attention's sum, frozen at it
            self._freeze_all(self.family.parts(self.model, layer).post_ln1, t)
        elif name.endswith("hook_mlp_in"):
            self._mlp_in = t
        elif name.endswith("hook_mlp_out"):
            self._add_part(t)
            if self.post:  # post-LN: the LayerNorm after the MLP's sum, frozen at it
                self._freeze_all(self.family.parts(self.model, layer).post_ln2, self._mlp_in + t)

    def _embeddings_done(self, resid0: torch.Tensor) -> None:
        stage = self.embed_stage
        tok = stage["hook_embed"]
        pos = stage.get("hook_pos_embed")
        typ = stage.get("hook_token_type_embed")
        pos_like = None if pos is None else (pos if typ is None else pos + typ)  # ``pos``: position and segment
        if pos_like is not None and pos_like.shape[0] == 1:
            pos_like = pos_like.expand(self.n, -1)
        parts = [tok] + ([pos_like] if pos_like is not None else [])
        norm = self.embed.norm
        if norm is not None:  # BERT and the chapter-3 encoder normalise the embeddings' sum
            whole = sum(parts)
            frozen_parts, beta = frozen_ln(norm, whole, parts)
            parts = frozen_parts
            if beta is not None:
                self._add_bias(beta.expand(self.n, -1))
        for p in parts:
            self._add_part(p)

    # pre-norm models: project each part as it arrives; post-norm models: keep the full vectors
    def _add_part(self, part: torch.Tensor) -> None:
        self._add_parts(part[None])

    def _add_parts(self, parts: torch.Tensor) -> None:
        """Components in order, (count, n, d_model): kept whole (post-norm) or projected at once (pre-norm)."""
        if self.whole:
            self.parts_full.extend(parts.unbind(0))
            return
        q_in, k_in = self._pre_project(parts)
        self.q_parts.extend(q_in.unbind(0))
        self.k_parts.extend(k_in.unbind(0))

    def _add_bias(self, part: torch.Tensor) -> None:
        """A constant that enters the residual stream (an earlier b_O)."""
        if self.whole:
            self.bias_full = part if self.bias_full is None else self.bias_full + part
            return
        q_in, k_in = self._pre_project(part)
        self.q_bias = q_in if self.q_bias is None else self.q_bias + q_in
        self.k_bias = k_in if self.k_bias is None else self.k_bias + k_in

    def _pre_project(self, part: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A part of the residual through the norm's linear map (its gain; LayerNorm: centring) and W_Q / W_K, before
        the per-position scale. Shape: (..., n, d_model) -> (..., n, d_head) twice."""
        out = (part.to(self._dtype) @ self._norm_qk.to(self._dtype)).double()
        d = self.lw.d_head
        return out[..., :d], out[..., d:]

    def _freeze_all(self, ln: Any, x: torch.Tensor) -> None:
        """Post-LN: every part so far through the LayerNorm frozen at its input ``x`` (n, d_model)."""
        parts = self.parts_full + ([self.bias_full] if self.bias_full is not None else [])
        frozen, beta = frozen_ln(ln, x, parts)
        if self.bias_full is not None:
            self.parts_full, self.bias_full = frozen[:-1], frozen[-1]
        else:
            self.parts_full = frozen
        if beta is not None:
            self.bias_full = beta.expand(self.n, -1) if self.bias_full is None else self.bias_full + beta

    # -- the layer's query and key from the parts --------------------------------------------------------
    def _finish(self) -> None:
        lw = self.lw
        if self.post:
            wq, wk = lw.W_Q[self.head].double(), lw.W_K[self.kv].double()
            parts = self.parts_full
            q = [p @ wq for p in parts]
            k = [p @ wk for p in parts]
            qb = None if self.bias_full is None else self.bias_full @ wq
            kb = None if self.bias_full is None else self.bias_full @ wk
            check = sum(parts) + (0 if self.bias_full is None else self.bias_full)
            self._check_sum(check)
            inv_q = inv_k = torch.ones(self.n, 1, dtype=torch.float64, device=self.at)
        else:
            q, k, qb, kb = self.q_parts, self.k_parts, self.q_bias, self.k_bias
            inv = inv_scale(lw, self.resid)  # (n, 1): 1/rms or 1/σ of the whole residual at each position
            inv_q = inv_k = inv
        q = [x * inv_q for x in q]
        k = [x * inv_k for x in k]
        qb = None if qb is None else qb * inv_q
        kb = None if kb is None else kb * inv_k
        if lw.ln1_b is not None and not self.post:  # LayerNorm's β through W_Q / W_K
            beta = lw.ln1_b.double()
            qb = (0 if qb is None else qb) + (beta @ lw.W_Q[self.head].double()).expand(self.n, -1)
            kb = (0 if kb is None else kb) + (beta @ lw.W_K[self.kv].double()).expand(self.n, -1)
        if lw.b_Q is not None:
            qb = (0 if qb is None else qb) + lw.b_Q[self.head].double().expand(self.n, -1)
        if lw.b_K is not None:
            kb = (0 if kb is None else kb) + lw.b_K[self.kv].double().expand(self.n, -1)
        has_bias = qb is not None or kb is not None
        if has_bias:
            q.append(torch.zeros_like(q[0]) if qb is None else qb)
            k.append(torch.zeros_like(k[0]) if kb is None else kb)
        Q, K = torch.stack(q), torch.stack(k)  # (C, n, d_head) each: every query position, every key position
        self.q_parts = self.k_parts = []  # freed: Q and K hold them, finished
        if lw.q_norm_w is not None:  # Qwen3, Gemma 3: per-head norms, frozen at the actual query and key
            eps = lw.qk_norm_eps
            Q = Q * torch.rsqrt(Q.sum(0).pow(2).mean(-1, keepdim=True) + eps) * lw.q_norm_w[self.head].double()
            K = K * torch.rsqrt(K.sum(0).pow(2).mean(-1, keepdim=True) + eps) * lw.k_norm_w[self.kv].double()
        if self.rope is not None:
            cos, sin = (t[0].detach().to(self.at, torch.float64) for t in self.rope)  # (n, d_head)
            attn = self.family.parts(self.model, self.layer).attn
            Q, K = (r[0] for r in apply_rotary(attn, Q[None], K[None], (cos[None], sin[None])))
        # A long text keeps them in float32 (2 x C x n x d_head numbers); the terms are summed in float64.
        store = torch.float32 if self.n >= COMPACT_FROM else torch.float64
        self.Q_all, self.K = Q.to(store), K.to(store)

    @property
    def Q(self) -> torch.Tensor:
        """Each component's share of the query at ``self.query``. Shape: (C, d_head) float64."""
        return self.Q_all[:, self.query].double()

    def _check_sum(self, whole: torch.Tensor) -> None:
        err = float((whole - self.resid).abs().max())
        if err > sum_tolerance(self.lw.W_Q.dtype) * max(1.0, float(self.resid.abs().max())):
            raise RuntimeError(f"The parts of layer {self.layer}'s input do not sum to it (off by {err:.2e}); this "
                               "family's blocks are not split correctly.")

    # -- answers -----------------------------------------------------------------------------------------
    def terms(self, key: int) -> np.ndarray:
        return ((self.Q @ self.K[:, key].double().T) * self.scale).cpu().numpy()  # (C, C)

    def score(self, key: int) -> float:
        return float(self.q_model[self.query] @ self.k_model[key] * self.scale)

    def capped(self, s: float) -> float:
        return s if self.softcap is None else float(self.softcap * np.tanh(s / self.softcap))

    def visible(self, j: int) -> bool:
        if not self.decoder:
            return True
        return j <= self.query and (self.window is None or self.query - j < self.window)

    def weights_row(self) -> np.ndarray:
        """The query's weights over every key, with the model's scale, softcap and mask (the one score kernel).
        Shape: (n,)."""
        s = attention_scores(self.q_model[self.query][None], self.k_model, scale=self.scale, softcap=self.softcap)
        allowed = torch.tensor([[self.visible(j) for j in range(self.n)]], device=s.device)
        return weights_from_scores(apply_mask(s, allowed))[0].cpu().numpy()

    def row_view(self, keys: Sequence[int]) -> np.ndarray:
        """Each key component's share of the score at each visible key (the query whole). Shape: (C, keys)."""
        q = self.Q.sum(0)  # (d_head,)
        idx = torch.as_tensor(list(keys))
        return (torch.einsum("d,ckd->ck", q, self.K[:, idx].double()) * self.scale).cpu().numpy()
