"""Retrieval heads (Wu et al., 2024, "Retrieval Head Mechanistically Explains Long-Context Factuality").

Protocol:

- The prompt is ``model_core.roles.haystack``: 22 sentences of prose the team wrote, a needle sentence with a
  password of three words drawn by the seed, and a question whose answer starts the password's sentence again
  (about 530 tokens with SmolLM2's tokenizer: short enough for a 2-core CPU, long enough that the needle is one
  sentence among many). The needle goes after 10 %, 50 % and 90 % of the haystack (``DEPTHS``), one run each.
- Greedy decoding with the KV cache through the one route (``Family.forward`` with ``past``): the prompt but its
  last token is read once in compact form (no weights kept), then each step feeds one token, and the capturing
  attention function (``model_core.families.capture``) records that step's query row in every layer and head.
- At a step whose greedy token w is one of the password's tokens, a head *copies* when its strongest key (the
  argmax of its attention row) is a password position holding w. A head's score is the number of steps at which
  it copies divided by the number of password tokens (Wu et al.'s |g_h ∩ k| / |k|), averaged over the depths. A
  run where the model copies nothing gives every head 0 for that depth, and ``copied`` says so.

Only a decoder generates: an encoder has no retrieval score.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache

from model_core.corpus.model import CorpusModel, LoadedCorpusModel
from model_core.gate import GATE
from model_core.models.run_memory import (
    check_run_memory,
    device_of,
    model_shape,
    run_memory_limit_mb,
    trace_pass_bytes,
)
from model_core.roles.haystack import HAYSTACK, haystack_prompt, password
from model_core.roles.probes import ENCODER_NOTES
from model_core.trace.request import Models, TraceRequest

DEPTHS: tuple[float, ...] = (0.1, 0.5, 0.9)
EXTRA_STEPS = 2
"""Greedy steps past the password's length (the model may start with a space or a quote)."""


@dataclass(frozen=True, eq=False)
class RetrievalResult:
    """Every head's retrieval score and what the runs did.

    Attributes:
        scores: (layer, head) float64 in [0, 1].
        secret: the password.
        prompts: the prompt of each depth.
        answers: the text the model generated at each depth.
        copied: how many password tokens the model generated at each depth (of ``answer_tokens``).
        answer_tokens: the password's length in tokens.
        n_tokens: the prompts' lengths in tokens.
    """

    scores: np.ndarray
    secret: str
    prompts: tuple[str, ...]
    answers: tuple[str, ...]
    copied: tuple[int, ...]
    answer_tokens: int
    n_tokens: tuple[int, ...]


def copy_hits(rows: np.ndarray, token: int, answer_positions: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Which heads copy ``token`` at this step: their strongest key is a password position holding ``token``.

    Shape: rows (layer, head, k_pos); answer_positions (m,); ids (>= k_pos,) -> (layer, head) bool.
    """
    best = rows.argmax(axis=-1)  # (layer, head)
    holds = np.zeros(rows.shape[-1], dtype=bool)
    holds[answer_positions[ids[answer_positions] == token]] = True
    return holds[best]


def password_positions(tokenizer: Any, prompt: str, needle: str, secret: str) -> tuple[np.ndarray, np.ndarray]:
    """The prompt's token ids and the positions of the tokens that overlap the password inside the needle.

    Shape: (pos,) int64 and (m,) int64.
    """
    enc = tokenizer(prompt, add_special_tokens=True, return_offsets_mapping=True)
    start = prompt.index(needle) + needle.index(secret)
    end = start + len(secret)
    answer = [i for i, (s, e) in enumerate(enc["offset_mapping"]) if e > s and s < end and e > start]
    return np.asarray(enc["input_ids"], dtype=np.int64), np.asarray(answer, dtype=np.int64)


def _one_depth(loaded: LoadedCorpusModel, prompt: str, needle: str, secret: str,
               step: Callable[[], None]) -> tuple[np.ndarray, str, int, int, int]:
    """Decode greedily after one prompt; (hits per head, generated text, tokens copied, password tokens, n).

    Every pass goes through the one route (``Family.forward`` with a key/value cache): the prompt's prefill in
    compact form (no n x n weights: the haystack is long), then one turn of the gate per generated token, so other
    users' passes go between the steps.
    """
    tok, model, family = loaded.tokenizer, loaded.module, loaded.family
    ids, answer = password_positions(tok, prompt, needle, secret)
    wanted = set(ids[answer].tolist())
    dev = loaded.device
    past = DynamicCache(config=model.config)
    prefix = torch.as_tensor(ids[None, :-1], device=dev)
    family.forward(model, prefix, torch.zeros_like(prefix), None, vectors=False, hidden=False, compact=True,
                   past=past)
    nxt = torch.as_tensor(ids[None, -1:], device=dev)
    step()
    hits = np.zeros((loaded.n_layers, loaded.n_heads))
    copied, generated = 0, []
    for _ in range(len(answer) + EXTRA_STEPS):
        with GATE.turn():  # until this step's weights are numpy
            out = family.forward(model, nxt, torch.zeros_like(nxt), None, vectors=False, hidden=False, logits=True,
                                 past=past)
            w = int(out.lm_logits[0, -1].argmax())
            rows = (torch.stack([out.weights[layer][0, :, -1, :] for layer in range(loaded.n_layers)]).float()
                    .cpu().numpy() if w in wanted else None)
        if rows is not None:
            hits += copy_hits(rows, w, answer, ids)
            copied += 1
        generated.append(w)
        nxt = torch.tensor([[w]], device=dev)
        step()
        if w == tok.eos_token_id or "\n" in tok.decode([w]):
            break
    return hits, tok.decode(generated), copied, len(answer), len(ids)


def _fitting_haystack(loaded: LoadedCorpusModel, secret: str) -> int:
    """The most haystack sentences whose prompt, and the answer after it, fit the model's positions (a GPT-2's
    position table; SmolLM2's 8,192 take the whole haystack).

    Raises:
        ValueError: not even the needle and the question fit.
    """
    for n in range(len(HAYSTACK), -1, -1):
        ids, answer = password_positions(loaded.tokenizer, *haystack_prompt(secret, 1.0, n), secret)
        if len(ids) + len(answer) + EXTRA_STEPS <= loaded.max_positions:
            return n
    raise ValueError(f"The needle-in-a-haystack prompt does not fit this model's {loaded.max_positions} positions.")


def retrieval_scores(request: TraceRequest, seed: int = 0, *, depths: tuple[float, ...] = DEPTHS,
                     models: Models | None = None, device: Any = None,
                     on_step: Callable[[int, int], None] | None = None) -> RetrievalResult:
    """Score every head of the request's decoder as a retrieval head (the module's protocol).

    Args:
        request: the model (its text is ignored).
        seed: draws the password.
        depths: where the needle goes, as shares of the haystack.
        models: where the model comes from (default ``Models()``; the app passes its cached loaders).
        device: "cpu", "cuda"... (default: the settings').
        on_step: called with (done, total) after each forward pass (a progress bar).

    Raises:
        ValueError: the model is an encoder, which generates nothing.
    """
    loaded = CorpusModel.from_request(request).load(device=device, models=models)
    if not loaded.family.is_decoder:
        raise ValueError(ENCODER_NOTES["retrieval"])
    secret = password(seed)
    n_sentences = _fitting_haystack(loaded, secret)
    prompts = [haystack_prompt(secret, d, n_sentences) for d in depths]
    tokens = max(len(loaded.tokenizer(p).input_ids) for p, _ in prompts)
    check_run_memory(f"Retrieval heads on a haystack of {tokens:,} tokens", trace_pass_bytes(
        model_shape(loaded.module), 1, tokens), run_memory_limit_mb(device=device_of(loaded.module)),
        "Use a model with fewer positions.")
    answer_len = len(password_positions(loaded.tokenizer, *prompts[0], secret)[1])
    total, done = len(depths) * (answer_len + EXTRA_STEPS + 1), [0]

    def step() -> None:
        done[0] += 1
        if on_step is not None:
            on_step(min(done[0], total), total)

    runs = [_one_depth(loaded, prompt, needle, secret, step) for prompt, needle in prompts]
    if on_step is not None:
        on_step(total, total)
    scores = np.mean([hits / n_answer for hits, _, _, n_answer, _ in runs], axis=0)
    return RetrievalResult(np.clip(scores, 0.0, 1.0), secret, tuple(p for p, _ in prompts),
                           tuple(r[1] for r in runs), tuple(r[2] for r in runs), runs[0][3],
                           tuple(r[4] for r in runs))
