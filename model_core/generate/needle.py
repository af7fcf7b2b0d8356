"""A needle test for compressed KV caches: one fact hidden in a long text the team wrote, a question at the end,
and for each policy and budget whether the model still answers from its compressed cache.

Protocol: the prompt (``needle_prompt``: the text, then the question and the start of the answer) is prefilled
and compressed as ``model_core.generate.kv`` does; the last token runs on the compressed cache at its true position,
then greedy decoding goes on for up to ``STEPS`` tokens, each generated token's key and value added to the cache
(uncompressed) at its own position. A budget passes when the answer (``ANSWER``) is in the decoded text. A policy's
nine budgets decode together as one padded batch (``model_core.generate.kv_batch``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from model_core.generate.kv import RATIOS, KVPlan, Progress, plan_kv
from model_core.generate.kv_batch import padded_cache, step_batch
from model_core.generate.presses import PRESSES, check_ratio, kept_positions

# Written by the team for this test: plain prose about a harbour town, with one fact in the middle.
HAYSTACK = (
    "The town of Kestrel Bay sits where a slow river meets the sea. Its houses are painted in pale colours, and in "
    "the summer the streets smell of salt and cut grass. Most families have lived there for generations, and many "
    "of them still earn their living from the water. In the early morning the fishing boats go out past the old "
    "stone pier, and by noon they come back with crates of mackerel and crab.\n\n"
    "The school stands on the hill above the harbour. It has two classrooms, a small library and a garden where "
    "the children grow beans and potatoes. On rainy days the teacher reads stories aloud, and the children listen "
    "to the wind rattling the windows. In the spring the whole school walks along the cliffs to count the nesting "
    "birds, and each child writes down what they saw in a notebook.\n\n"
    "Every market day the square fills with stalls. Farmers from the valley bring cheese, apples and honey, and "
    "a baker sells round loaves that are still warm. People stop to talk about the weather, the price of fuel and "
    "the football match on Saturday. An old man plays the accordion by the fountain, and the dogs of the town lie "
    "in the shade under the tables.\n\n"
    "The lighthouse on the northern point has not been staffed for many years, but the harbour master still climbs "
    "its stairs once a week to check the lamp. He is a careful man who writes everything in a ledger. The harbour "
    "master keeps the spare key to the lighthouse in a green teapot on the shelf above his desk. Nobody else in "
    "the town knows where it is.\n\n"
    "In the autumn the storms arrive. Waves break over the sea wall, and the boats stay tied up in the inner "
    "harbour for days at a time. The fishermen mend their nets in the long shed by the slipway, drinking tea and "
    "telling the same stories they told the year before. When the weather clears, the beach is covered with "
    "driftwood and tangled seaweed, and the children go down to look for shells and pieces of coloured glass.\n\n"
    "Winter is quiet. The café on the corner closes at four, and the only light on the front comes from the pub, "
    "where a fire burns all evening. The ferry to the islands runs twice a week if the sea allows it. People read, "
    "knit and repair what the storms have broken, and they wait for the days to grow longer again.\n\n"
)
QUESTION = "Question: Where does the harbour master keep the spare key to the lighthouse?\nAnswer: He keeps it in a"
ANSWER = "teapot"
"""What a passing answer contains (case-insensitive)."""
STEPS = 6
"""Greedy tokens decoded after the prompt."""


def needle_prompt() -> str:
    """The text, then the question and the start of its answer."""
    return HAYSTACK + QUESTION


@dataclass(frozen=True, eq=False)
class NeedleResult:
    """Which policy still answers at which budget.

    Attributes:
        presses, ratios: the grid's rows and columns.
        passed: whether the answer was decoded. Shape: (press, ratio) bool.
        answers: the decoded text. Shape: (press, ratio) str.
        full_answer, full_passed: the same on the uncompressed cache.
        n_tokens: the prompt's length in tokens.
    """

    presses: tuple[str, ...]
    ratios: tuple[float, ...]
    passed: np.ndarray
    answers: np.ndarray
    full_answer: str
    full_passed: bool
    n_tokens: int

    def to_rows(self) -> list[dict[str, Any]]:
        """One row per (press, ratio), for a CSV; the uncompressed cache first (ratio 0)."""
        rows = [{"press": "full cache", "compression_ratio": 0.0, "passed": self.full_passed,
                 "answer": self.full_answer}]
        return rows + [{"press": p, "compression_ratio": r, "passed": bool(self.passed[i, j]),
                        "answer": str(self.answers[i, j])}
                       for i, p in enumerate(self.presses) for j, r in enumerate(self.ratios)]


def decode_batch(family: Any, model: Any, plan: KVPlan, kept: Sequence[np.ndarray], tokenizer: Any,
                 steps: int = STEPS) -> list[str]:
    """Greedy decoding from the planned prompt's cache of each kept set, all in one batch (``kv_batch``): the last
    prompt token at its true position, then ``steps`` tokens; stops early once every row has decoded ``ANSWER``.

    Shape: kept: each (layer, kv_head, k_b) int64.
    """
    pre = plan.prefill
    cache, mask = padded_cache(pre, kept)
    tokens = torch.full((len(kept),), int(pre.token_ids[-1]), device=mask.device)
    position, out_ids = len(pre.token_ids) - 1, [[] for _ in kept]
    for _ in range(steps):
        logits, cache = step_batch(family, model, tokens, cache, mask, position)
        tokens = logits.argmax(-1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)  # the new token's key is seen next step
        position += 1
        for row, token in zip(out_ids, tokens.tolist()):
            row.append(token)
        texts = [tokenizer.decode(row) for row in out_ids]
        if all(ANSWER in text.lower() for text in texts):
            break
    return [tokenizer.decode(row) for row in out_ids]


def needle_test(family: Any, model: Any, tokenizer: Any, presses: Sequence[str] = PRESSES,
                ratios: Sequence[float] = RATIOS, *, progress: Progress | None = None) -> NeedleResult:
    """Every policy at every ratio on ``needle_prompt``: does the model still answer?

    Raises:
        ValueError: the model is not a decoder, its positions cannot hold the text, or an unknown press.
    """
    ids = np.asarray(tokenizer(needle_prompt()).input_ids, dtype=np.int64)
    room = family.max_positions(model.config)
    if len(ids) + STEPS > room:
        raise ValueError(f"The needle text is {len(ids)} tokens with this tokenizer and {STEPS} more are decoded; "
                         f"this model's positions allow {room}. Use a decoder with a longer context, such as "
                         "SmolLM2-135M-Instruct.")
    plan = plan_kv(family, model, ids, tuple(presses))
    presses, ratios = tuple(presses), tuple(check_ratio(r) for r in ratios)
    n_prefill = plan.prefill.n_prefill
    every = np.broadcast_to(np.arange(n_prefill), plan.orders[presses[0]].shape).copy()
    full = decode_batch(family, model, plan, [every], tokenizer)[0]
    if progress is not None:
        progress(1, len(presses) + 1)
    passed = np.zeros((len(presses), len(ratios)), dtype=bool)
    answers = np.full((len(presses), len(ratios)), "", dtype=object)
    for i, press in enumerate(presses):
        budgets = [(j, int(n_prefill * (1 - r))) for j, r in enumerate(ratios)]
        budgets = [(j, k) for j, k in budgets if k >= 1]
        texts = decode_batch(family, model, plan, [kept_positions(plan.orders[press], k) for _, k in budgets],
                             tokenizer) if budgets else []
        for (j, _), text in zip(budgets, texts):
            answers[i, j], passed[i, j] = text, ANSWER in text.lower()
        if progress is not None:
            progress(i + 2, len(presses) + 1)
    return NeedleResult(presses, ratios, passed, answers, full, ANSWER in full.lower(), len(ids))
