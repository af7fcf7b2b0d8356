"""Why a head attends where it does: an attention score split into query-side x key-side components.

For head h of layer l, query i and key j, the residual stream entering layer l is the sum of its parts: the token
embedding (``embed``), the position (and segment) embedding (``pos``) where positions are absolute, every earlier
head's write, every earlier MLP's output, and the constant biases (``bias``). With every norm frozen at its actual
statistics (the norm before attention at the whole residual's scale; post-LN BERT's and the chapter-3 encoder's
LayerNorms, Gemma's post-attention norm, Qwen3/Gemma 3's per-head query and key norms each at its own input), the
query and the key are linear in the parts: ``q_i = Σ_c q_i^c`` and ``k_j = Σ_d k_j^d``, the rotary embedding at each
position included. ``terms[c][d] = q_i^c · k_j^d × scale`` then sums to the score s_ij before the mask and the
softmax, exactly (Kamath et al., 2025, "QK attributions"). Gemma 2's softcap is not linear: the split is of the score
before the cap.

Every tensor is read through the hook points (``model_core.families.hooked.run_with_hooks``) in one pass, and only
at the positions asked for: nothing of size layer x head x n² x d is held. The parts of a pre-norm model are projected
on the key side as they arrive, so the row view at thousands of tokens holds (component, key, d_head) numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from model_core.families import family_of
from model_core.families.hooked import run_with_hooks
from model_core.families.hooks import apply_rotary
from model_core.families.parts import norm_eps
from model_core.families.weights import LayerWeights, layer_weights
from model_core.trace.resolve import resolve

COMPACT_FROM = 1024
"""From this many tokens the pass attends with sdpa and never forms the n x n pattern; the weight of a key is then
computed from the layer's queries and keys (causal rows; a sliding window is applied where the layer has one)."""


@dataclass(frozen=True, eq=False)
class QKVersus:
    """The same split for a second key: why key j rather than key j'."""

    key: int
    score: float
    weight: float
    terms: np.ndarray  # (C, C): query component x key component, for s_ij'

    @property
    def log_odds(self) -> float:
        """log(a_ij / a_ij') = s_ij − s_ij' (for capped scores, of the capped ones)."""
        return self._log_odds

    _log_odds: float = 0.0


@dataclass(frozen=True, eq=False)
class QKTerms:
    """One head's score at (query, key) split into query component x key component.

    Shape: terms (C, C), rows the query's components, columns the key's; row (C, keys): each component's key-side
    share of the score at every key the query sees (the row view), or None.
    """

    tokens: list[str]
    layer: int
    head: int
    query: int
    key: int
    score: float
    weight: float
    components: list[str]
    terms: np.ndarray
    versus: QKVersus | None = None
    softcap: float | None = None
    row: np.ndarray | None = None
    row_keys: list[int] = field(default_factory=list)
    capped_score: float | None = None

    @property
    def query_side(self) -> np.ndarray:
        """Each query component's share of the score (terms summed over the key's components). Shape: (C,)."""
        return self.terms.sum(axis=1)

    @property
    def key_side(self) -> np.ndarray:
        """Each key component's share of the score (terms summed over the query's components). Shape: (C,)."""
        return self.terms.sum(axis=0)

    def top_pairs(self, n: int = 5, terms: np.ndarray | None = None) -> list[tuple[str, str, float]]:
        """The n (query component, key component, term) with the largest |term|."""
        t = self.terms if terms is None else terms
        flat = np.argsort(-np.abs(t), axis=None)[:n]
        return [(self.components[int(i) // t.shape[1]], self.components[int(i) % t.shape[1]],
                 float(t.flat[int(i)])) for i in flat]

    def to_json(self) -> dict[str, Any]:
        """The ``qk`` verb's JSON: tokens, layer, head, query, key, score, weight, components, terms, versus."""
        out: dict[str, Any] = {"tokens": self.tokens, "layer": self.layer, "head": self.head, "query": self.query,
                               "key": self.key, "score": self.score, "weight": self.weight,
                               "components": self.components, "terms": self.terms.tolist()}
        if self.versus is not None:
            v = self.versus
            out["versus"] = {"key": v.key, "score": v.score, "weight": v.weight, "log_odds": v.log_odds,
                             "terms": v.terms.tolist()}
        if self.softcap is not None:
            out["softcap"] = self.softcap
            out["capped_score"] = self.capped_score
        return out


def component_names(model: Any, layer: int) -> list[str]:
    """The components of layer ``layer``'s input, in the ``qk`` verb's order: ``embed``, ``pos`` (absolute
    positions), each earlier layer's heads then its MLP, and ``bias`` where the model has a constant term."""
    family = family_of(model)
    names = ["embed"] + (["pos"] if family.embed_parts(model).pos_embed is not None else [])
    for l in range(layer):
        names += [f"L{l}H{h}" for h in range(family.n_heads(model.config))] + [f"L{l}MLP"]
    return names + (["bias"] if _has_bias(model, layer) else [])


def _has_bias(model: Any, layer: int) -> bool:
    """Whether any constant reaches layer ``layer``'s query or key: b_Q, b_K, a norm's β, an earlier b_O."""
    weights = layer_weights(model)
    lw = weights[layer]
    if lw.b_Q is not None or lw.b_K is not None or lw.ln1_b is not None:
        return True
    family = family_of(model)
    if any(w.b_O is not None for w in weights[:layer]):
        return True
    embed = family.embed_parts(model)
    parts = [family.parts(model, l) for l in range(layer)]
    lns = [embed.norm] + [p.post_ln1 for p in parts] + [p.post_ln2 for p in parts]
    return any(ln is not None and getattr(ln, "bias", None) is not None for ln in lns)


def qk_terms(model: Any, tokenizer: Any, input_ids: torch.Tensor, layer: int, head: int, query: int,
             key: int | None = None, versus: int | None = None, *, row: bool = False,
             token_type_ids: torch.Tensor | None = None) -> QKTerms:
    """Split head ``head`` of layer ``layer``'s score at (query, key) into query x key components.

    Args:
        input_ids: (1, pos), the text as the model reads it. Negative positions count from the end.
        key: default: the key the query attends to most; ``versus``: a second key (default: the runner-up).
        row: also each component's key-side share at every key the query sees (the row view).

    Raises:
        ValueError: a position out of range, a key the query cannot see, a head or layer that does not exist; the
            message names the valid range.
    """
    family = family_of(model)
    cfg = model.config
    n = int(input_ids.shape[1])
    n_layers, n_heads = family.n_layers(cfg), family.n_heads(cfg)
    if not 0 <= layer < n_layers:
        raise ValueError(f"Layer {layer} does not exist: this model has layers 0..{n_layers - 1}.")
    if not 0 <= head < n_heads:
        raise ValueError(f"Head {head} does not exist: each layer has heads 0..{n_heads - 1}.")
    query = _position(query, n, "query")
    lw = layer_weights(model)[layer]
    pass_ = _Pass(model, family, lw, layer, head, query, input_ids, token_type_ids, row)
    weights_row = pass_.weights_row()  # (n,) the query's softmax over every key, 0 where it cannot see
    visible = [j for j in range(n) if pass_.visible(j)]
    if key is None:
        key = int(np.argmax(weights_row))
    key = _position(key, n, "key")
    if not pass_.visible(key):
        raise ValueError(f"Query {query} cannot see key {key}: a decoder's query sees keys 0..{query} (the causal "
                         "mask); pick a key in that range.")
    if versus is None and len(visible) > 1:
        order = [j for j in np.argsort(-weights_row, kind="stable") if int(j) != key and pass_.visible(int(j))]
        versus = int(order[0]) if order else None
    elif versus is not None:
        versus = _position(versus, n, "versus key")
        if not pass_.visible(versus):
            raise ValueError(f"Query {query} cannot see key {versus}: pick a key in 0..{query}.")
    terms = pass_.terms(key)
    score = pass_.score(key)
    comp = component_names(model, layer)
    assert terms.shape == (len(comp), len(comp)), (terms.shape, len(comp))
    vs = None
    if versus is not None:
        v_score = pass_.score(versus)
        log_odds = (pass_.capped(score) - pass_.capped(v_score))
        vs = QKVersus(key=versus, score=v_score, weight=float(weights_row[versus]), terms=pass_.terms(versus),
                      _log_odds=float(log_odds))
    tokens = tokenizer.convert_ids_to_tokens(input_ids[0].tolist()) if tokenizer is not None else \
        [str(t) for t in input_ids[0].tolist()]
    row_view = pass_.row_view(visible) if row else None
    return QKTerms(tokens=list(tokens), layer=layer, head=head, query=query, key=key, score=score,
                   weight=float(weights_row[key]), components=comp, terms=terms, versus=vs, softcap=lw_softcap(pass_),
                   row=row_view, row_keys=visible if row else [],
                   capped_score=pass_.capped(score) if pass_.softcap is not None else None)


def lw_softcap(pass_: "_Pass") -> float | None:
    return pass_.softcap


def _position(p: int, n: int, what: str) -> int:
    if not -n <= p < n:
        raise ValueError(f"The {what} position {p} is out of range: the text has {n} tokens, positions 0..{n - 1} "
                         f"(or -{n}..-1 from the end).")
    return p % n


class _Pass:
    """One hooked pass that gathers the parts of layer ``layer``'s input at the positions asked for."""

    def __init__(self, model: Any, family: Any, lw: LayerWeights, layer: int, head: int, query: int,
                 input_ids: torch.Tensor, token_type_ids: torch.Tensor | None, row: bool) -> None:
        self.model, self.family, self.lw, self.layer, self.head, self.query = model, family, lw, layer, head, query
        n = int(input_ids.shape[1])
        self.n = n
        self.kv = lw.kv_of_head[head]
        self.decoder = family.is_decoder
        self.post = family.parts(model, 0).post_norm or lw.ln1_kind is None
        self.positions = list(range(n))  # parts are kept at every position (pair: projected, so cheap)
        self.embed = family.embed_parts(model)
        self.parts_full: list[torch.Tensor] = []  # post-norm models: (npos, d_model) float64 per component
        self.bias_full: torch.Tensor | None = None
        self.q_parts: list[torch.Tensor] = []  # pre-norm: each component's query-side projection at i, (d_head,)
        self.k_parts: list[torch.Tensor] = []  # pre-norm: key-side projection at every position, (n, d_head)
        self.q_bias = None
        self.k_bias = None
        self.embed_stage: dict[str, torch.Tensor] = {}
        self._weights = layer_weights(model)
        names = self._names()
        compact = self.decoder and n >= COMPACT_FROM
        hooks = [(name, self._reader(name)) for name in names]
        with torch.no_grad():
            out = run_with_hooks(model, input_ids, hooks=hooks, names=[f"blocks.{layer}.attn.hook_q",
                                                                      f"blocks.{layer}.attn.hook_k"],
                                 compact=compact, keep_rope=True, token_type_ids=token_type_ids)
        self.rope = (out.rope or {}).get(layer)
        b = f"blocks.{layer}.attn"
        self.q_model = out.cache[f"{b}.hook_q"][0, :, head].double()  # (n, d_head) after rope
        k_all = out.cache[f"{b}.hook_k"][0].double()
        self.k_model = k_all[:, self.kv] if k_all.shape[1] == lw.n_kv_heads else k_all[:, head]
        self.scale = lw.scale  # the model's own (tests check the weights it gives against the model's pattern)
        self.softcap = _model_softcap(out.output, layer)
        self.window = _window(model, layer)
        self._finish()

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
            names += [f"{b}.attn.hook_result", f"{b}.hook_mlp_out"]
            if self.post:
                names += [f"{b}.hook_resid_mid", f"{b}.hook_mlp_in"]
        return names + ([f"blocks.{self.layer}.hook_resid_pre"] if self.layer else [])

    def _reader(self, name: str):
        def read(t: torch.Tensor, _point: Any) -> None:
            self._take(name, t[0].detach().double())
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
        if name.endswith("hook_result"):  # (n, head, d_model): each head's write, then b_O as a constant
            heads = t
            if lw_l.out_norm_w is not None:  # Gemma 2/3: the post-attention norm, frozen at the attention's output
                whole = heads.sum(1) + (0 if lw_l.b_O is None else lw_l.b_O.double())
                inv = torch.rsqrt(whole.pow(2).mean(-1, keepdim=True) + lw_l.out_norm_eps)  # (n, 1)
                heads = heads * inv[:, None] * lw_l.out_norm_w.double()
            for h in range(heads.shape[1]):
                self._add_part(heads[:, h])
            if lw_l.b_O is not None and lw_l.out_norm_w is None:
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
            frozen_parts, beta = _frozen_ln(norm, whole, parts)
            parts = frozen_parts
            if beta is not None:
                self._bias_direct(beta.expand(self.n, -1))
        for p in parts:
            self._add_part(p)

    # pre-norm models: project each part as it arrives; post-norm models: keep the full vectors
    def _add_part(self, part: torch.Tensor) -> None:
        if self.post:
            self.parts_full.append(part)
            return
        q_in, k_in = self._pre_project(part)
        self.q_parts.append(q_in)
        self.k_parts.append(k_in)

    def _add_bias(self, part: torch.Tensor) -> None:
        """A constant that enters the residual stream (an earlier b_O)."""
        if self.post:
            self.bias_full = part if self.bias_full is None else self.bias_full + part
            return
        q_in, k_in = self._pre_project(part)
        self.q_bias = q_in if self.q_bias is None else self.q_bias + q_in
        self.k_bias = k_in if self.k_bias is None else self.k_bias + k_in

    def _bias_direct(self, part: torch.Tensor) -> None:
        self._add_bias(part)

    def _pre_project(self, part: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A part of the residual through the norm's linear map (its gain; LayerNorm: centring) and W_Q / W_K, before
        the per-position scale. Shape: (n, d_model) -> (d_head,), (n, d_head)."""
        lw = self.lw
        x = part - part.mean(-1, keepdim=True) if lw.ln1_kind == "layer" else part
        if lw.ln1_w is not None:
            x = x * lw.ln1_w.double()
        return x[self.query] @ lw.W_Q[self.head].double(), x @ lw.W_K[self.kv].double()

    def _freeze_all(self, ln: Any, x: torch.Tensor) -> None:
        """Post-LN: every part so far through the LayerNorm frozen at its input ``x`` (n, d_model)."""
        parts = self.parts_full + ([self.bias_full] if self.bias_full is not None else [])
        frozen, beta = _frozen_ln(ln, x, parts)
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
            q = [p[self.query] @ wq for p in parts]
            k = [p @ wk for p in parts]
            qb = None if self.bias_full is None else self.bias_full[self.query] @ wq
            kb = None if self.bias_full is None else self.bias_full @ wk
            check = sum(parts) + (0 if self.bias_full is None else self.bias_full)
            self._check_sum(check)
            inv_q, inv_k = 1.0, torch.ones(self.n, 1, dtype=torch.float64)
        else:
            q, k, qb, kb = self.q_parts, self.k_parts, self.q_bias, self.k_bias
            inv = _inv_scale(lw, self.resid)  # (n, 1): 1/rms or 1/σ of the whole residual at each position
            inv_q, inv_k = inv[self.query], inv
        q = [x * inv_q for x in q]
        k = [x * inv_k for x in k]
        qb = None if qb is None else qb * inv_q
        kb = None if kb is None else kb * inv_k
        if lw.ln1_b is not None and not self.post:  # LayerNorm's β through W_Q / W_K
            beta = lw.ln1_b.double()
            qb = (0 if qb is None else qb) + beta @ lw.W_Q[self.head].double()
            kb = (0 if kb is None else kb) + (beta @ lw.W_K[self.kv].double()).expand(self.n, -1)
        if lw.b_Q is not None:
            qb = (0 if qb is None else qb) + lw.b_Q[self.head].double()
        if lw.b_K is not None:
            kb = (0 if kb is None else kb) + lw.b_K[self.kv].double().expand(self.n, -1)
        has_bias = qb is not None or kb is not None
        if has_bias:
            q.append(torch.zeros_like(q[0]) if qb is None else qb)
            k.append(torch.zeros_like(k[0]) if kb is None else kb)
        Q, K = torch.stack(q), torch.stack(k)  # (C, d_head), (C, n, d_head)
        if lw.q_norm_w is not None:  # Qwen3, Gemma 3: per-head norms, frozen at the actual query and key
            eps = lw.qk_norm_eps
            Q = Q * torch.rsqrt(Q.sum(0).pow(2).mean(-1) + eps) * lw.q_norm_w[self.head].double()
            K = K * torch.rsqrt(K.sum(0).pow(2).mean(-1, keepdim=True) + eps) * lw.k_norm_w[self.kv].double()
        if self.rope is not None:
            cos, sin = (t[0].double() for t in self.rope)  # (n, d_head)
            attn = self.family.parts(self.model, self.layer).attn
            Qr, _ = apply_rotary(attn, Q[None, :, None, :], Q[None, :, None, :],
                                 (cos[None, self.query:self.query + 1], sin[None, self.query:self.query + 1]))
            _, Kr = apply_rotary(attn, K[None], K[None], (cos[None], sin[None]))
            Q, K = Qr[0, :, 0], Kr[0]
        self.Q, self.K = Q, K

    def _check_sum(self, whole: torch.Tensor) -> None:
        err = float((whole - self.resid).abs().max())
        if err > 1e-3 * max(1.0, float(self.resid.abs().max())):
            raise RuntimeError(f"The parts of layer {self.layer}'s input do not sum to it (off by {err:.2e}); this "
                               "family's blocks are not split correctly.")

    # -- answers -----------------------------------------------------------------------------------------
    def terms(self, key: int) -> np.ndarray:
        return ((self.Q @ self.K[:, key].T) * self.scale).numpy()  # (C, C)

    def score(self, key: int) -> float:
        return float(self.q_model[self.query] @ self.k_model[key] * self.scale)

    def capped(self, s: float) -> float:
        return s if self.softcap is None else float(self.softcap * np.tanh(s / self.softcap))

    def visible(self, j: int) -> bool:
        if not self.decoder:
            return True
        return j <= self.query and (self.window is None or self.query - j < self.window)

    def weights_row(self) -> np.ndarray:
        s = (self.k_model @ self.q_model[self.query]) * self.scale  # (n,)
        if self.softcap is not None:
            s = torch.tanh(s / self.softcap) * self.softcap
        mask = torch.tensor([self.visible(j) for j in range(self.n)])
        s = s.masked_fill(~mask, float("-inf"))
        return torch.softmax(s, dim=0).numpy()

    def row_view(self, keys: Sequence[int]) -> np.ndarray:
        """Each key component's share of the score at each visible key (the query whole). Shape: (C, keys)."""
        q = self.Q.sum(0)  # (d_head,)
        idx = torch.as_tensor(list(keys))
        return (torch.einsum("d,ckd->ck", q, self.K[:, idx]) * self.scale).numpy()


def _inv_scale(lw: LayerWeights, resid: torch.Tensor) -> torch.Tensor:
    """1/rms (RMSNorm) or 1/σ (LayerNorm) of the whole residual at each position, with the norm's epsilon."""
    if lw.ln1_kind == "layer":
        return torch.rsqrt(resid.var(-1, unbiased=False, keepdim=True) + lw.ln1_eps)
    return torch.rsqrt(resid.pow(2).mean(-1, keepdim=True) + lw.ln1_eps)


def _frozen_ln(ln: Any, x: torch.Tensor, parts: list[torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """A LayerNorm frozen at ``x`` applied to each part (centre, divide by σ(x), scale); and its β."""
    inv = torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + norm_eps(ln))
    gain = ln.weight.detach().double() if getattr(ln, "weight", None) is not None else 1.0
    out = [(p - p.mean(-1, keepdim=True)) * inv * gain for p in parts]
    beta = ln.bias.detach().double() if getattr(ln, "bias", None) is not None else None
    return out, beta


def _model_softcap(output: Any, layer: int) -> float | None:
    caps = getattr(output, "layer_softcaps", None)
    if caps:
        return caps[layer]
    return getattr(output, "score_softcap", None)


def _window(model: Any, layer: int) -> int | None:
    """The sliding window of layer ``layer``'s attention, or None (every key up to the query)."""
    cfg = model.config
    window = getattr(cfg, "sliding_window", None)
    if not window:
        return None
    types = getattr(cfg, "layer_types", None)
    if types is not None and types[layer] != "sliding_attention":
        return None
    return int(window)


def encode_exactly(tokenizer: Any, text: str) -> torch.Tensor:
    """``tokenizer(text).input_ids`` as a (1, pos) tensor: no chat template, nothing added beyond what the tokenizer
    adds itself (BERT's [CLS] and [SEP]; nothing for SmolLM2).

    Raises:
        ValueError: the text is empty or has no tokens.
    """
    if not text or not text.strip():
        raise ValueError("The text is empty: type a sentence (for an induction head, a repeated one).")
    ids = tokenizer(text)["input_ids"]
    if not ids:
        raise ValueError("The text has no tokens this tokenizer knows.")
    return torch.tensor([ids], dtype=torch.long)


def qk_for_request(request: Any, layer: int, head: int, query: int = -1, key: int | None = None,
                   versus: int | None = None, *, row: bool = False, device: str | None = None) -> QKTerms:
    """The QK split for a ``TraceRequest`` (its model and text), positions indexing ``tokenizer(text).input_ids``.

    Raises:
        ModelLoadError: the model cannot be loaded. ValueError: bad positions, layer, head or text.
    """
    resolved = resolve(request, device=device)
    ids = encode_exactly(resolved.tokenizer, request.text_a)
    limit = int(resolved.max_positions)
    if ids.shape[1] > limit:
        raise ValueError(f"The text has {ids.shape[1]} tokens; this model reads at most {limit}. Shorten it.")
    return qk_terms(resolved.model, resolved.tokenizer, ids, layer, head, query, key, versus, row=row)
