"""Every run knows its memory before it starts: peak-memory estimates from a run's shapes, and the one check that
refuses a run over ``AE_RUN_MEMORY_MB`` with the estimate and the limit in its message.

The estimates are pure functions of shapes (tokens, batch, layers, heads, d_model, d_ff, vocab, bytes a number),
calibrated against the peak resident memory measured on SmolLM2-135M (``tests/test_run_memory.py`` and the README's
settings section give the table); they count what a run holds above the loaded model, and lean high. Each entry
point (``model_core.circuits.run``, ``effects.patching_run``, ``circuits.mean_patching``, ``qk.terms``,
``compact.build``, ``generate.generation``, ``corpus.run``, ``roles``) calls ``check_run_memory`` before its first
pass.

The graph of edge attribution has S = 1 + L(H + 1) senders and R = L(3H + 1) + 1 receivers; a batch of B pairs of
T tokens stacks N = B·T positions of d_model numbers for each.
"""

from __future__ import annotations

import gc
import traceback
from dataclasses import dataclass
from typing import Any

from model_core.settings import Settings, load_settings

MB = 1e6
OVERHEAD_MB = 150.0
"""What any run holds besides its tensors (the allocator's arenas, the hooks' bookkeeping), measured ~100 MB."""
MARGIN = 1.1
"""The estimates' headroom over what they count: measured peaks on SmolLM2 came within 0-25% below them."""


ATLAS_MARGIN = 1.35
"""The atlas's headroom over what ``atlas_bytes`` counts: the 1,000-text SmolLM2 atlas peaked 1.3 times above it
(the allocator's arenas and the cards' Python objects, besides the tensors)."""


class RunMemoryError(ValueError):
    """A run whose estimated peak memory is over ``AE_RUN_MEMORY_MB``; the message names both and what to change."""


@dataclass(frozen=True)
class ModelShape:
    """What a run's memory depends on in the model.

    Attributes:
        n_layers, n_heads, n_kv_heads, d_model, d_head, d_ff, vocab: the model's sizes.
        act_bytes: bytes of one activation (the model's dtype: 4 for float32, 2 for bfloat16).
    """

    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int
    d_ff: int
    vocab: int
    act_bytes: int = 4

    def __post_init__(self) -> None:
        if min(self.n_layers, self.n_heads, self.n_kv_heads, self.d_model, self.d_head, self.d_ff, self.vocab,
               self.act_bytes) < 1:
            raise ValueError(f"A model shape has positive sizes, not {self}.")

    @property
    def stack_bytes(self) -> int:
        """Bytes of one number in the circuits' stacks and sums: the model's own, at least float32."""
        return max(4, self.act_bytes)

    @property
    def n_senders(self) -> int:
        return 1 + self.n_layers * (self.n_heads + 1)

    @property
    def n_receivers(self) -> int:
        return self.n_layers * (3 * self.n_heads + 1) + 1


def _first(config: Any, *names: str, default: int | None = None) -> int:
    for name in names:
        value = getattr(config, name, None)
        if value:
            return int(value)
    if default is None:
        raise ValueError(f"The model's config names none of {', '.join(names)}: its run memory cannot be estimated.")
    return default


def model_shape(model: Any) -> ModelShape:
    """The shape of a loaded transformers model (or the chapter-3 encoder) from its config and parameters' dtype."""
    config = getattr(model, "config", model)
    config = getattr(config, "text_config", None) or config
    n_layers = _first(config, "num_hidden_layers", "n_layer", "num_layers")
    n_heads = _first(config, "num_attention_heads", "n_head", "num_heads")
    d_model = _first(config, "hidden_size", "n_embd", "d_model")
    d_head = _first(config, "head_dim", default=max(1, d_model // n_heads))
    try:
        act_bytes = next(model.parameters()).element_size()
    except (AttributeError, StopIteration, TypeError):
        act_bytes = 4
    return ModelShape(n_layers, n_heads, _first(config, "num_key_value_heads", default=n_heads), d_model, d_head,
                      _first(config, "intermediate_size", "n_inner", default=4 * d_model),
                      _first(config, "vocab_size", default=1), act_bytes)


# -- the estimates (bytes) -------------------------------------------------------------------------------------------
def forward_bytes(shape: ModelShape, batch: int, tokens: int, *, grad: bool = False, logits: bool = True) -> float:
    """One pass of ``batch`` sequences of ``tokens`` through the hook layer's eager attention.

    Without gradients only one layer's activations live at a time: its scores, masked scores and weights
    (batch·H·T² each) and its MLP (batch·T·d_ff, three times). With gradients every layer's are kept for the
    backward pass (their scores and weights: two of the three). Logits are (batch, T, vocab).
    """
    a, n = shape.act_bytes, batch * tokens
    attention = (2 if grad else 3) * a * batch * shape.n_heads * tokens * tokens
    layer = attention + a * n * (8 * shape.d_model + 3 * shape.d_ff)
    held = layer * (shape.n_layers if grad else 1) + a * n * shape.d_model * (shape.n_layers + 1)
    return held + (a * n * shape.vocab * (3 if grad else 1) if logits else 0.0)


def circuit_scores_bytes(shape: ModelShape, batch: int, tokens: int) -> float:
    """EAP / EAP-IG on one batch (``circuits.eap.score_batch``): the clean and corrupted sender stacks (2·S·N·d),
    the receivers' gradient sum (R·N·d) and, in the gradient pass, the gradients of each query head's own q, k and v
    inputs (the split inputs: 3·L·H·N·d) on top of a gradient pass."""
    n, d = batch * tokens, shape.d_model
    stacks = shape.stack_bytes * n * d * (2 * shape.n_senders + shape.n_receivers)
    split = shape.act_bytes * n * d * 3 * shape.n_layers * shape.n_heads
    return stacks + split + forward_bytes(shape, batch, tokens, grad=True)


def circuit_curve_bytes(shape: ModelShape, batch: int, tokens: int) -> float:
    """One batch of the faithfulness curve (``circuits.evaluate.circuit_metrics``): the corrupted sender stack and
    the patched pass's Δ (2·S·N·d), each receiver group's loss and its subtraction (2·R·N·d), a pass without
    gradients."""
    n, d = batch * tokens, shape.d_model
    stacks = shape.stack_bytes * n * d * 2 * (shape.n_senders + shape.n_receivers)
    return stacks + forward_bytes(shape, batch, tokens)


def circuit_batch_bytes(shape: ModelShape, batch: int, tokens: int, *, curve: bool = True) -> float:
    """A circuit run's peak for batches of ``batch`` pairs of ``tokens`` tokens: the larger of its two parts."""
    scores = circuit_scores_bytes(shape, batch, tokens)
    return OVERHEAD_MB * MB + MARGIN * max(scores, circuit_curve_bytes(shape, batch, tokens) if curve else 0.0)


def patching_bytes(shape: ModelShape, tokens: int, *, attribution: bool = True, copies: int = 1) -> float:
    """Exact patching of one pair (``effects.patching``): both runs' resid_pre and z per layer (4·L·T·d), patched
    passes of ``copies`` copies of the prompt; with ``attribution`` the corrupted run's gradient pass too."""
    kept = 4 * shape.act_bytes * shape.n_layers * tokens * max(shape.d_model, shape.n_heads * shape.d_head)
    passes = forward_bytes(shape, copies, tokens, logits=False) + shape.act_bytes * copies * shape.vocab
    if attribution:
        passes = max(passes, forward_bytes(shape, 1, tokens, grad=True) + kept)
    return OVERHEAD_MB * MB + kept + passes


def trace_pass_bytes(shape: ModelShape, batch: int, tokens: int, *, keep_weights: bool = True) -> float:
    """One traced pass (a corpus batch, head roles' probes, a reply's prefill): the pass, and with
    ``keep_weights`` every layer's weights (batch·L·H·T² float32) as the trace keeps them."""
    weights = 4 * batch * shape.n_layers * shape.n_heads * tokens * tokens if keep_weights else 0.0
    return OVERHEAD_MB * MB + forward_bytes(shape, batch, tokens) + weights


def compact_trace_bytes(shape: ModelShape, tokens: int, *, on_device: bool = False, softcap: bool = False,
                        masks: int = 1, block_numbers: int = 1 << 26) -> float:
    """A compact trace (``model_core.compact.build``) of one text of ``tokens`` tokens.

    On the host: what it keeps, every layer's queries and keys (4·L·(H + kv)·T·d_head), the rows' lse (8·L·H·T)
    and each distinct mask (two T² booleans while it is worked out), and the sdpa pass: one layer's activations and
    the model's additive masks (T² numbers each), no T² weights. With ``softcap`` (Gemma 2's capped scores) the
    layers run the model's eager attention instead: the scores, their cap and a float32 softmax, (2·a + 4)·H·T².
    ``masks``: how many distinct masks the layers use (2 with sliding-window layers).

    With ``on_device`` (the summary on a GPU) it counts the device instead: every layer's queries and keys held
    there in the model's dtype, the pass, the masks as booleans, and a streamed block's scores (three float32
    buffers, four with a softcap, of ``block_numbers`` scores, or of 256 rows where those are more:
    ``compact.summary.DEVICE_BLOCK_NUMBERS``); the host's arrays are checked apart (``build_compact``).

    Measured on SmolLM2 on the CPU, fresh process: 133, 256 and 594 MB above the model at 1,024, 2,048 and 4,096
    tokens.
    """
    a, n, h = shape.act_bytes, tokens, shape.n_heads
    per_position = shape.n_layers * (h + shape.n_kv_heads) * shape.d_head
    layer = a * n * (8 * shape.d_model + 3 * shape.d_ff) + masks * a * n * n
    if softcap:
        layer += (2 * a + 4) * h * n * n
    if on_device:  # ``compact.summary.block_rows``: 256 rows at least, however many scores they make
        rows = max(1, block_numbers // (h * n * 256)) * 256
        block = h * min(rows, n) * n
        buffers = 4 if softcap else 3
        return OVERHEAD_MB * MB + MARGIN * (a * per_position * n + layer + buffers * 4 * block + masks * n * n)
    kept = 4 * per_position * n + 8 * shape.n_layers * h * n + 2 * masks * n * n
    return OVERHEAD_MB * MB + MARGIN * (kept + layer)


def atlas_bytes(shape: ModelShape, tokens: int, scan_batch: int, card_batch: int, *, long_from: int,
                block: int, chunk: int = 768 * MB) -> float:
    """An atlas run's peak (``model_core.atlas``): the larger of its three steps at texts of ``tokens`` tokens.

    - the scan of texts under ``long_from`` tokens: a traced pass of ``scan_batch`` texts and its masks (three
      batch·T² booleans);
    - the cards' pass (``why.text_arrays``) of ``card_batch`` texts: the traced pass with its queries, keys, values
      and hidden states, copied to the host and cut per text (twice), one text's float64 parts of every
      layer's heads and MLP (8·L·(H + 1)·T·d), and each head's mean effect on every logit (8·L·H·vocab);
    - a text of ``long_from`` tokens or more, scanned alone through the compact pass: one layer's activations,
      every layer's queries and keys (4·L·(H + kv)·T·d_head), one block of ``block`` query rows (three float32
      H·block·T copies) and the scan's masks (six T² booleans); its card pass (``long_arrays``) keeps, beside the
      same pass, every layer's queries, keys, heads' outputs and residual stream on the host
      (4·(L·(2H + kv)·T·d_head + (L + 1)·T·d)), one layer's float64 parts twice (2·8·(H + 1)·T·d) and the
      key-side maps of the contexts split together (``chunk``).
    """
    short = min(tokens, long_from - 1)
    a = shape.act_bytes
    scan = trace_pass_bytes(shape, scan_batch, short) + 3 * scan_batch * short * short
    held = (shape.n_layers * shape.n_heads * short * (short + 3 * shape.d_head)
            + (shape.n_layers + 1) * short * shape.d_model)  # numbers a text's card pass keeps
    cards = (trace_pass_bytes(shape, card_batch, short) + 2 * 4 * card_batch * held
             + 8 * shape.n_layers * (shape.n_heads + 1) * short * shape.d_model
             + 8 * shape.n_layers * shape.n_heads * shape.vocab)
    peak = max(scan, cards)
    if tokens >= long_from:
        n = tokens
        compact = (a * n * (8 * shape.d_model + 3 * shape.d_ff) + 4 * shape.n_layers * (shape.n_heads + shape.n_kv_heads)
                   * n * shape.d_head + 3 * 4 * shape.n_heads * block * n + 6 * n * n)
        held = 4 * n * (shape.n_layers * (2 * shape.n_heads + shape.n_kv_heads) * shape.d_head
                         + (shape.n_layers + 1) * shape.d_model)
        long_cards = compact + held + 2 * 8 * (shape.n_heads + 1) * n * shape.d_model + chunk
        peak = max(peak, OVERHEAD_MB * MB + long_cards)
    return ATLAS_MARGIN * peak


def generation_bytes(shape: ModelShape, prompt: int, new_tokens: int) -> float:
    """Generating ``new_tokens`` after ``prompt`` tokens: the prefill pass and the key/value cache of the whole
    sequence (2·L·kv_heads·T·d_head)."""
    total = prompt + new_tokens
    cache = 2 * shape.act_bytes * shape.n_layers * shape.n_kv_heads * total * shape.d_head
    return OVERHEAD_MB * MB + forward_bytes(shape, 1, prompt) + cache


def qk_bytes(shape: ModelShape, tokens: int, n_components: int) -> float:
    """Why this key on one head: one pass, and each of ``n_components`` parts of the head's query and key at every
    position (2·C·T·d_head), and their C² products at one query (C²·T)."""
    parts = 2 * 4 * n_components * tokens * shape.d_head + 4 * n_components * n_components * tokens
    return OVERHEAD_MB * MB + forward_bytes(shape, 1, tokens) + parts


# -- the limit and the check -----------------------------------------------------------------------------------------
GPU_SHARE = 0.9
"""On a GPU a run may take at most this share of the memory free there when it is checked (the rest: the allocator's
blocks and what other passes hold meanwhile)."""


class GpuLimit(float):
    """A run's limit in MB set by a GPU's free memory, not by AE_RUN_MEMORY_MB: ``refusal`` says so."""

    device: str
    free_mb: float

    def __new__(cls, device: str, free_mb: float) -> GpuLimit:
        limit = super().__new__(cls, GPU_SHARE * free_mb)
        limit.device, limit.free_mb = device, free_mb
        return limit


def device_of(model: Any) -> Any:
    """The device a model's parameters are on."""
    return next(model.parameters()).device


def run_memory_limit_mb(settings: Settings | None = None, override_mb: float | None = None,
                        device: Any = None) -> float:
    """The limit a run is checked against: ``override_mb`` (the command line's --run-memory-mb) when given, else
    ``AE_RUN_MEMORY_MB`` of ``settings`` (default: read from the environment). On a CUDA ``device`` (where the
    run's tensors live) it is at most ``GPU_SHARE`` of the memory free there now (a ``GpuLimit``): AE_RUN_MEMORY_MB
    is a share of the host's memory, which a GPU may have less of."""
    if override_mb is not None:
        if not override_mb > 0:
            raise ValueError(f"--run-memory-mb is a number of MB above 0, not {override_mb!r}.")
        limit = float(override_mb)
    else:
        limit = float((settings or load_settings()).run_memory_mb)
    if device is None or getattr(device, "type", str(device).split(":")[0]) != "cuda":
        return limit
    import torch  # only for a GPU's free memory: `--help` reads this module without torch

    free_mb = torch.cuda.mem_get_info(device)[0] / MB
    return GpuLimit(str(device), free_mb) if GPU_SHARE * free_mb < limit else limit


def fits(estimate_bytes: float, limit_mb: float) -> bool:
    """Whether an estimate fits the limit."""
    return estimate_bytes <= limit_mb * MB


def refusal(what: str, estimate_bytes: float, limit_mb: float, advice: str) -> str:
    """The message of a refused run: what it is, the estimate, the limit (a GPU's free memory, for a ``GpuLimit``),
    and what to change."""
    if isinstance(limit_mb, GpuLimit):
        return (f"{what} would need about {estimate_bytes / MB:,.0f} MB of memory on the GPU, over the "
                f"{float(limit_mb):,.0f} MB one run may take there now ({GPU_SHARE:.0%} of the {limit_mb.free_mb:,.0f} "
                f"MB free on {limit_mb.device}). {advice} A smaller model, a lower precision (AE_DTYPE=bfloat16) or a "
                "GPU with more memory leaves more room.")
    return (f"{what} would need about {estimate_bytes / MB:,.0f} MB of memory, over this server's limit of "
            f"{limit_mb:,.0f} MB for one run (AE_RUN_MEMORY_MB). {advice} On a machine with more memory, raise "
            "AE_RUN_MEMORY_MB (on the command line: --run-memory-mb).")


def check_run_memory(what: str, estimate_bytes: float, limit_mb: float, advice: str) -> None:
    """Refuse a run whose estimate is over the limit.

    Raises:
        RunMemoryError: the message (``refusal``) names the run, the estimate, the limit and ``advice``.
    """
    if not fits(estimate_bytes, limit_mb):
        raise RunMemoryError(refusal(what, estimate_bytes, limit_mb, advice))


def longest_fitting(estimate: Any, limit_mb: float, hi: int = 1 << 17) -> int:
    """The largest n ≥ 0 with ``estimate(n)`` within the limit (``estimate`` grows with n), for the advice."""
    lo = 0
    if fits(estimate(hi), limit_mb):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(estimate(mid), limit_mb) else (lo, mid)
    return lo


# -- a run that ran out of memory anyway -----------------------------------------------------------------------------
_ALLOCATOR_WORDS = ("out of memory", "can't allocate memory", "not enough memory")


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation that failed: CUDA's ``OutOfMemoryError``, Python's ``MemoryError``, or the CPU
    allocator's RuntimeError. Estimates are checked before every run, but other runs may take the memory meanwhile."""
    import torch  # start-up time: this module is read without torch (the CLI's parser, the settings)

    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and any(w in str(exc).lower() for w in _ALLOCATOR_WORDS)


def after_out_of_memory(exc: BaseException) -> str:
    """Give a GPU's cached blocks back (so the passes of other sessions have them) and say what happened and what to
    try, in one paragraph without a traceback."""
    import torch  # start-up time, as above

    detail = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
    where = "the machine"
    if isinstance(exc, torch.OutOfMemoryError) or "cuda" in str(exc).lower():
        where = "the GPU"
        if torch.cuda.is_available():
            # the traceback's frames still hold the failed pass's tensors: cleared first, else nothing is freed
            traceback.clear_frames(exc.__traceback__)
            gc.collect()
            torch.cuda.empty_cache()
    return (f"This run ran out of memory on {where} and was stopped; nothing of it was kept. Its estimate fitted when "
            "it started, so other runs probably took the memory meanwhile. Try again in a moment, or with a shorter "
            f"text, fewer pairs or a smaller batch. ({detail})")
