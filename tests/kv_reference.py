"""An independent reference for the KV-cache policies and their cost, written from the papers' definitions (and
kvpress 0.5.5's defaults) with transformers' plain eager model and explicit loops: no code of model_core.generate.

- Scores read ``output_attentions`` of the prefill (every token but the last) and the keys transformers' own cache
  holds after it; each policy ranks keys with Python's ``sorted`` (best score first, ties to the later position).
- The compressed next-token distribution is computed WITHOUT a cache: the whole text runs once more with a per-layer,
  per-head attention mask that hides from the last query the keys its key/value head dropped (a forward pre-hook
  gives each attention layer its own (1, head, n, n) mask). The prefill rows keep the plain causal mask, so they are
  exactly the prefill's, and the last token sits at its true position n - 1 by construction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

N_SINK, WINDOW, KERNEL = 4, 64, 5


@dataclass
class Eager:
    """What the reference reads from one text."""

    model: object
    ids: torch.Tensor  # (1, n)
    attentions: np.ndarray  # prefill: (layer, head, n_p, n_p)
    keys: np.ndarray  # prefill cache keys: (layer, kv_head, n_p, d_head)
    last_row: np.ndarray  # whole text, last query: (layer, head, n)
    group: int  # query heads per key/value head


def eager_reference(folder, token_ids) -> Eager:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    ids = torch.tensor([list(token_ids)])
    with torch.no_grad():
        pre = model(ids[:, :-1], output_attentions=True, use_cache=True)
        whole = model(ids, output_attentions=True)
    attentions = np.stack([a[0].double().numpy() for a in pre.attentions])
    keys = np.stack([layer.keys[0].double().numpy() for layer in pre.past_key_values.layers])
    last_row = np.stack([a[0, :, -1].double().numpy() for a in whole.attentions])
    return Eager(model, ids, attentions, keys, last_row, attentions.shape[1] // keys.shape[1])


def n_kept(n_p: int, ratio: float) -> int:
    return int(n_p * (1 - ratio))  # kvpress's count, in floating point


def _top(scores: list[float], k: int) -> list[int]:
    ranked = sorted(range(len(scores)), key=lambda j: (-scores[j], -j))
    return sorted(ranked[:k])


def _snapkv_group_scores(ref: Eager, layer: int) -> tuple[list[list[float]], int]:
    """Each key/value head's pooled window attention on the keys before the window; and the window's size."""
    A = ref.attentions
    n_heads, n_p = A.shape[1], A.shape[2]
    w = WINDOW if n_p > WINDOW else max(1, n_p // 2)
    m = n_p - w
    groups = []
    for g in range(n_heads // ref.group):
        heads = [h for h in range(n_heads) if h // ref.group == g]
        per_head = []
        for h in heads:
            mean = [sum(A[layer, h, i, j] for i in range(m, n_p)) / w for j in range(m)]
            per_head.append([sum(mean[t] for t in range(j - 2, j + 3) if 0 <= t < m) / KERNEL for j in range(m)])
        groups.append([sum(p[j] for p in per_head) / len(heads) for j in range(m)])
    return groups, w


def kept_sets(ref: Eager, press: str, ratio: float) -> list[list[list[int]]]:
    """layer -> kv head -> the kept positions, from the definitions."""
    A, K = ref.attentions, ref.keys
    n_layers, n_heads, n_p, _ = A.shape
    n_kv = K.shape[1]
    k = n_kept(n_p, ratio)
    out = []
    for la in range(n_layers):
        if press == "snapkv":
            groups, w = _snapkv_group_scores(ref, la)
            best = max((s for grp in groups for s in grp), default=0.0)  # the window scores above every key
        per_kv = []
        for g in range(n_kv):
            heads = [h for h in range(n_heads) if h // ref.group == g]
            if press == "streaming_llm":
                kept = list(range(min(k, N_SINK))) + list(range(n_p - max(0, k - N_SINK), n_p))
                per_kv.append(sorted(set(kept)))
                continue
            if press == "knorm":
                scores = [-math.sqrt(sum(x * x for x in K[la, g, j])) for j in range(n_p)]
            elif press == "snapkv":
                scores = groups[g] + [best + 1] * w
            elif press == "tova":
                row = [sum(A[la, h, n_p - 1, j] for h in range(n_heads)) / n_heads for j in range(n_p - 1)]
                scores = row + [max(row) + 1]
            elif press == "observed_attention":
                scores = [sum(sum(A[la, h, i, j] for i in range(n_p)) / (n_p - j) for h in heads) / len(heads)
                          for j in range(n_p)]
            else:
                raise ValueError(press)
            per_kv.append(_top(scores, k))
        out.append(per_kv)
    return out


def retained(ref: Eager, kept: list[list[list[int]]]) -> np.ndarray:
    n_layers, n_heads, _ = ref.last_row.shape
    return np.array([[sum(ref.last_row[la, h, j] for j in kept[la][h // ref.group]) for h in range(n_heads)]
                     for la in range(n_layers)])


def attention_modules(model) -> list:
    base = getattr(model, "model", None)
    if base is not None and hasattr(base, "layers"):
        return [layer.self_attn for layer in base.layers]
    return [block.attn for block in model.transformer.h]


def _causal(m: int, n_heads: int) -> torch.Tensor:
    """Allowed (query head, query, key) of a plain causal model of ``m`` tokens, to narrow."""
    return torch.ones(m, m, dtype=torch.bool).tril()[None].repeat(n_heads, 1, 1)


def _logits_with(model, ids: torch.Tensor, allowed: list[torch.Tensor] | None) -> torch.Tensor:
    """The model's last-position logits with each layer's attention limited to ``allowed[layer]`` (query head, query,
    key), passed as every attention module's additive mask; None: the plain model."""
    hooks = []
    for module, layer_allowed in zip(attention_modules(model), allowed or []):
        mask = torch.zeros(1, *layer_allowed.shape).masked_fill(~layer_allowed[None], torch.finfo(torch.float32).min)

        def swap(_module, args, kwargs, mask=mask):
            kwargs["attention_mask"] = mask
            return args, kwargs

        hooks.append(module.register_forward_pre_hook(swap, with_kwargs=True))
    try:
        with torch.no_grad():
            return model(ids).logits[0, -1]
    finally:
        for hook in hooks:
            hook.remove()


def masked_log_probs(ref: Eager, kept: list[list[list[int]]] | None) -> np.ndarray:
    """The last token's next-token log-probabilities with, in each layer, each query head's last row seeing only
    its key/value head's kept keys and itself (``kept`` None: the plain causal model)."""
    n = ref.ids.shape[1]
    n_heads = ref.last_row.shape[1]
    allowed = None
    if kept is not None:
        allowed = []
        for layer_kept in kept:
            layer = _causal(n, n_heads)
            for h in range(n_heads):
                row = torch.zeros(n, dtype=torch.bool)
                row[layer_kept[h // ref.group]] = True
                row[n - 1] = True
                layer[h, n - 1] = row
            allowed.append(layer)
    logits = _logits_with(ref.model, ref.ids, allowed).double()
    return torch.log_softmax(logits, -1).numpy()


def kl(log_p: np.ndarray, log_q: np.ndarray) -> float:
    return float(sum(math.exp(a) * (a - b) for a, b in zip(log_p, log_q)))


def masked_greedy(ref: Eager, kept: list[list[list[int]]], steps: int) -> list[int]:
    """Greedy decoding without a cache: the prompt, then each generated token appended; every query from the last
    prompt token on sees only its key/value head's kept prompt keys and the tokens from the last prompt token on."""
    n = ref.ids.shape[1]
    n_heads = ref.last_row.shape[1]
    ids, out = ref.ids, []
    for _ in range(steps):
        allowed = []
        for layer_kept in kept:
            layer = _causal(ids.shape[1], n_heads)
            for h in range(n_heads):
                prompt = torch.zeros(n - 1, dtype=torch.bool)
                prompt[layer_kept[h // ref.group]] = True
                layer[h, n - 1:, : n - 1] = prompt
            allowed.append(layer)
        token = int(_logits_with(ref.model, ids, allowed).argmax())
        out.append(token)
        ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    return out
