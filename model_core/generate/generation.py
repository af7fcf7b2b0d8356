"""Generate a reply through the one forward route: a prompt (in the model's chat template or as typed), one prefill
pass and one pass per new token on a transformers key/value cache, each pass its own turn of the route's gate (so
other sessions interleave). Greedy by default (the same tokens as transformers' ``generate(do_sample=False)``), or
sampling with a temperature, top-p and a seed. Each step keeps the model's top next-token candidates.

``GenerationStream`` yields each new token as it comes (a page streams them) and ends at an end-of-sequence token
(kept), at ``max_new_tokens``, or when its ``stop`` callable says so, keeping what it generated. ``Generation`` is
the result; ``Generation.request`` names its whole sequence (prompt and reply) as a ``TraceRequest``, so the one
trace builder traces it exactly (``model_core.trace.sequence``) with the reply's start marked.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from transformers import DynamicCache

from model_core.families.checks import require_decoder
from model_core.gate import GATE
from model_core.generate.prompting import DecodingOptions, check_room, eos_ids, has_chat_template, prompt_ids
from model_core.models.run_memory import (
    check_run_memory,
    device_of,
    generation_bytes,
    model_shape,
    run_memory_limit_mb,
)
from model_core.settings import Settings, load_settings
from model_core.trace.forward import decode_top, to_host
from model_core.trace.request import TraceRequest
from model_core.trace.resolve import token_limit

TOP_CANDIDATES = 10
"""How many next-token candidates each step keeps."""
EAGER_PREFILL_MB = 64
"""A prompt whose attention weights (layer x head x k² float32) pass this is prefilled with sdpa (the compact
route), which keeps no weights: eager attention would hold them all until the pass ends (283 MB for SmolLM2 at
512 tokens). Below it the prefill is eager, exactly as transformers' eager model. Every later step (one new token)
runs with sdpa too: nothing reads its weights (the reply's trace is built afterwards), and eager attention's copy of
the shared keys for every query head cost 16% of a step."""

StopReason = Literal["eos", "length", "stopped"]


@dataclass(frozen=True, eq=False)
class Step:
    """One generated token.

    Attributes:
        position: its position in the whole sequence (the prompt's length for the first).
        token_id: the token. piece: the tokenizer's piece for it.
        text: the reply's new text with this token (special tokens skipped; "" while a character's bytes are
            incomplete), for streaming.
        candidate_ids, candidate_probs: the model's top next-token candidates at this step, best first, and their
            probabilities (the model's own distribution, before temperature and top-p). Shape: (k,).
        candidate_strings: their text.
        seconds: when the token was chosen, in seconds from the generation's start (the prompt's prefill
            included); NaN when not timed.
    """

    position: int
    token_id: int
    piece: str
    text: str
    candidate_ids: np.ndarray
    candidate_probs: np.ndarray
    candidate_strings: tuple[str, ...]
    seconds: float = math.nan


@dataclass(frozen=True, eq=False)
class Generation:
    """A finished (or stopped) generation: the prompt's ids, the new ids and each step's candidates.

    Attributes:
        prompt_ids: Shape: (k,) int64. new_ids: the generated ids, an end-of-sequence token kept. Shape: (new,).
        tokens: the new ids' pieces. reply: the new ids decoded with special tokens skipped (a leading space kept).
        text: the whole sequence decoded with special tokens kept (``TraceRequest.text_a`` of its trace).
        candidate_ids, candidate_probs: each step's top candidates. Shape: (new, k). candidate_strings: their text.
        reason: why it ended: "eos" (an end-of-sequence token), "length" (max_new_tokens), "stopped" (asked to).
        chat: whether the prompt was wrapped in the chat template. options: the decoding options.
        first_token_s: seconds from the start to the first new token (the prefill included), None if not timed.
        tokens_per_s: new tokens per second after the first, as they were produced (a streaming reader's time
            between tokens included), None with fewer than two timed tokens.
    """

    prompt_ids: np.ndarray
    new_ids: np.ndarray
    tokens: tuple[str, ...]
    reply: str
    text: str
    candidate_ids: np.ndarray
    candidate_probs: np.ndarray
    candidate_strings: tuple[tuple[str, ...], ...]
    reason: StopReason
    chat: bool = False
    options: DecodingOptions = field(default_factory=DecodingOptions)
    first_token_s: float | None = None
    tokens_per_s: float | None = None

    @property
    def token_ids(self) -> np.ndarray:
        """The whole sequence: prompt, then reply. Shape: (k + new,) int64."""
        return np.concatenate([self.prompt_ids, self.new_ids]).astype(np.int64)

    @property
    def reply_start(self) -> int:
        """The first new token's position: the prompt's length."""
        return len(self.prompt_ids)

    @property
    def n_new(self) -> int:
        return len(self.new_ids)

    def request(self, model_id: str | None) -> Any:
        """The ``TraceRequest`` of the whole sequence (its ids, its text, the reply's start) for the model
        ``model_id``: every page reads its trace.

        Raises:
            ValueError: nothing was generated (no reply to trace).
        """
        if self.n_new == 0:
            raise ValueError("Nothing was generated yet, so there is no reply to trace; generate again.")
        return TraceRequest("pretrained", self.text, "", model_id=model_id, token_ids=tuple(self.token_ids.tolist()),
                            reply_start=self.reply_start)


def assemble(tokenizer: Any, prompt: list[int] | np.ndarray, steps: list[Step], reason: StopReason, *,
             chat: bool = False, options: DecodingOptions | None = None, k: int = TOP_CANDIDATES) -> Generation:
    """A ``Generation`` from its prompt and the steps generated so far (all of them, or those before a stop)."""
    prompt = np.asarray(prompt, dtype=np.int64)
    new = np.array([s.token_id for s in steps], dtype=np.int64)
    full = np.concatenate([prompt, new]).tolist()
    return Generation(
        prompt_ids=prompt, new_ids=new, tokens=tuple(s.piece for s in steps),
        reply=tokenizer.decode(new.tolist(), skip_special_tokens=True),
        text=tokenizer.decode(full, skip_special_tokens=False),
        candidate_ids=np.stack([s.candidate_ids for s in steps]) if steps else np.zeros((0, k), dtype=np.int64),
        candidate_probs=(np.stack([s.candidate_probs for s in steps]).astype(np.float32) if steps
                         else np.zeros((0, k), dtype=np.float32)),
        candidate_strings=tuple(s.candidate_strings for s in steps), reason=reason, chat=chat,
        options=options or DecodingOptions(), **_speed(steps))


def _speed(steps: list[Step]) -> dict[str, float | None]:
    """first_token_s and tokens_per_s from the steps' times (None where they are not timed)."""
    first = steps[0].seconds if steps and math.isfinite(steps[0].seconds) else None
    span = steps[-1].seconds - steps[0].seconds if first is not None and len(steps) > 1 else math.nan
    return {"first_token_s": first,
            "tokens_per_s": (len(steps) - 1) / span if math.isfinite(span) and span > 0 else None}


class GenerationStream:
    """Generate from ``prompt`` token by token; iterate it for each ``Step`` as it comes, then read ``result()``.

    Args:
        family, model, tokenizer: a decoder's adapter, model (loaded by ``model_core.models.loading``) and tokenizer.
        prompt: the prompt's ids (``prompt_ids``).
        options: the decoding options.
        stop: called before each new pass; True ends the generation, keeping what it generated ("stopped").
        limit: the most tokens the whole sequence may hold (default: the model's positions).
        chat: whether ``prompt`` is in the chat template (recorded in the result).
        top_k: candidates kept per step.

    Raises:
        ValueError: the model is not a decoder, or the prompt leaves no room (``check_room``).
    """

    def __init__(self, family: Any, model: Any, tokenizer: Any, prompt: list[int], options: DecodingOptions, *,
                 stop: Callable[[], bool] | None = None, limit: int | None = None, limit_hint: str = "",
                 chat: bool = False, top_k: int = TOP_CANDIDATES,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        require_decoder(family, "generating text")
        self.family, self.model, self.tokenizer = family, model, tokenizer
        self.prompt = [int(i) for i in prompt]
        self.options, self.stop, self.chat, self.top_k = options, stop, chat, top_k
        limit = family.max_positions(model.config) if limit is None else limit
        check_room(len(self.prompt), options.max_new_tokens, limit, limit_hint)
        check_run_memory(f"Generating {options.max_new_tokens:,} tokens after a prompt of {len(self.prompt):,}",
                         generation_bytes(model_shape(model), len(self.prompt), options.max_new_tokens),
                         run_memory_limit_mb(device=device_of(model)),
                         "Shorten the prompt or ask for fewer new tokens.")
        self.steps: list[Step] = []
        self._clock = clock  # a test passes a fake one: the step times are then exact
        self._started = clock()
        self.reason: StopReason | None = None
        self.eos = eos_ids(model, tokenizer)
        self._printed = 0

    def __iter__(self) -> Iterator[Step]:
        model, options = self.model, self.options
        device = next(model.parameters()).device
        cache = DynamicCache(config=model.config)
        generator = torch.Generator().manual_seed(int(options.seed)) if options.sample else None
        self._started = self._clock()
        logits = self._pass(torch.tensor([self.prompt], device=device), cache, prefill=True)
        position = len(self.prompt)
        while True:
            step = self._step(logits, position, generator)
            self.steps.append(step)
            yield step
            if step.token_id in self.eos:
                self.reason = "eos"
                return
            if len(self.steps) >= options.max_new_tokens:
                self.reason = "length"
                return
            if self.stop is not None and self.stop():
                self.reason = "stopped"
                return
            logits = self._pass(torch.tensor([[step.token_id]], device=device), cache)
            position += 1

    def text_chunks(self, every_s: float = 0.0) -> Iterator[str]:
        """The reply's text as it grows, chunk by chunk (for ``st.write_stream``); at the end, any bytes held back
        (a character the reply never finished) as the tokenizer decodes them.

        Args:
            every_s: the shortest time between two chunks: the tokens that come sooner join the next chunk (the
                first token is never held). A browser redraws the whole reply at every chunk.
        """
        held, last = "", -math.inf
        for step in self:
            held += step.text
            if held and time.perf_counter() - last >= every_s:
                yield held
                held, last = "", time.perf_counter()
        if held:
            yield held
        tail = self.tokenizer.decode([s.token_id for s in self.steps], skip_special_tokens=True)[self._printed:]
        if tail:
            yield tail

    def result(self) -> Generation:
        """What was generated so far; "stopped" unless the generation ended by itself."""
        return assemble(self.tokenizer, self.prompt, self.steps, self.reason or "stopped", chat=self.chat,
                        options=self.options, k=self.top_k)

    def _pass(self, ids: torch.Tensor, cache: Any, prefill: bool = False) -> torch.Tensor:
        """One pass through the route on ``ids`` extending ``cache``: the last position's next-token logits through
        the final norm and the unembedding (as transformers' ``generate`` keeps one position's logits).

        Shape: ids (1, pos) -> (vocab,) float32.
        """
        family, model = self.family, self.model
        config = model.config
        weights_mb = 4 * family.n_layers(config) * family.n_heads(config) * ids.shape[1] ** 2 / 1e6
        out = family.forward(model, ids, torch.zeros_like(ids), None, vectors=False, hidden="last", past=cache,
                             compact=not prefill or weights_mb > EAGER_PREFILL_MB)
        with GATE.turn(), torch.inference_mode():  # the final norm and the unembedding: the model's weights
            return family.unembed(model, out.hidden[-1][:, -1])[0].float()

    def _step(self, logits: torch.Tensor, position: int, generator: torch.Generator | None) -> Step:
        """Choose the next token from ``logits`` (vocab,) and describe it."""
        probs = torch.softmax(logits, dim=-1)
        top = probs.topk(min(self.top_k, probs.shape[-1]), dim=-1)
        if self.options.sample:  # drawn on the host (choose_token), as the seeded generator lives there
            token = choose_token(logits, self.options, generator)
            ids, values = to_host([top.indices, top.values], pack=True)
        else:  # greedy: the choice comes over with the candidates, one copy from the device a step
            chosen, ids, values = to_host([torch.argmax(logits)[None], top.indices, top.values], pack=True)
            token = int(chosen[0])
        ids, values = ids.astype(np.int64), values.astype(np.float32)
        strings = decode_top(ids, self.tokenizer)
        new = [s.token_id for s in self.steps] + [token]
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        chunk = ""
        if not text.endswith("\ufffd"):  # a character whose bytes are not all out yet waits for the next token
            chunk, self._printed = text[self._printed:], len(text)
        return Step(position=position, token_id=token, piece=self.tokenizer.convert_ids_to_tokens(token), text=chunk,
                    candidate_ids=ids, candidate_probs=values, candidate_strings=strings,
                    seconds=self._clock() - self._started)


def choose_token(logits: torch.Tensor, options: DecodingOptions, generator: torch.Generator | None = None) -> int:
    """The next token: the most likely (greedy), or a sample from the top-p share of the distribution at the
    temperature (transformers' rule: keep the most likely tokens until their probability reaches ``top_p``).

    Shape: logits (vocab,).
    """
    if not options.sample:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float().cpu() / options.temperature, dim=-1)
    if options.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        before = sorted_probs.cumsum(0) - sorted_probs  # the probability of the tokens ranked above each one
        sorted_probs[before >= options.top_p] = 0.0  # the first token is always kept
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs / probs.sum(), 1, generator=generator))


def start_generation(loaded: Any, prompt: str, *, chat: bool = False, options: DecodingOptions | None = None,
                     settings: Settings | None = None, stop: Callable[[], bool] | None = None) -> GenerationStream:
    """The one way into generation (the app's page, the notebook, the command line and ``generate`` all start here):
    the prompt's ids (``prompt_ids``) and a stream whose whole sequence must stay within the token limit
    (``AE_MAX_TOKENS`` within the model's positions, ``token_limit``), so that the reply can be traced.

    Args:
        loaded: a decoder: a ``LoadedModel`` or a ``Resolved`` (its family, model, tokenizer and max_positions).
        settings: the deployment's (default: a ``Resolved``'s own, else read from the environment).

    Raises:
        ValueError: an empty prompt, no chat template, an encoder (``NotADecoder``), or no room (``check_room``).
    """
    settings = settings or getattr(loaded, "settings", None) or load_settings()
    limit = token_limit(settings, loaded.max_positions)
    return GenerationStream(loaded.family, loaded.model, loaded.tokenizer, prompt_ids(loaded.tokenizer, prompt, chat),
                            options or DecodingOptions(), stop=stop, chat=chat, limit=limit["max_tokens"],
                            limit_hint=limit["limit_hint"])


def generate(loaded: Any, prompt: str, *, chat: bool = False, options: DecodingOptions | None = None,
             settings: Settings | None = None, stop: Callable[[], bool] | None = None) -> Generation:
    """Generate a reply to ``prompt`` with a loaded decoder: ``start_generation`` (and its errors), run to its end."""
    stream = start_generation(loaded, prompt, chat=chat, options=options, settings=settings, stop=stop)
    for _ in stream:
        pass
    return stream.result()


__all__ = ["DecodingOptions", "EAGER_PREFILL_MB", "Generation", "GenerationStream", "Step", "TOP_CANDIDATES",
           "assemble", "check_room", "choose_token", "eos_ids", "generate", "has_chat_template", "prompt_ids",
           "start_generation"]
