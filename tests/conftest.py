"""Shared fixtures: the real bundled model, traced once per test session."""

from __future__ import annotations

import os

import pytest

from tiny_models import FAMILIES as TINY_FAMILIES

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never touch the network
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def bundled():
    from model_core.models.loading import load_pretrained

    return load_pretrained(None, device="cpu")


@pytest.fixture(scope="session")
def bert_pair_trace():
    from model_core import DEFAULT_TEXT_A, DEFAULT_TEXT_B, TraceRequest, build_trace

    return build_trace(TraceRequest("bert", DEFAULT_TEXT_A, DEFAULT_TEXT_B), device="cpu")


@pytest.fixture(scope="session")
def tiny_bert():
    """A tiny random transformers BertModel (fast parity checks)."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64, attn_implementation="eager")
    return BertModel(config).eval()


def pytest_addoption(parser):
    parser.addoption("--order", choices=("file", "reverse"), default="file",
                     help="reverse: run the tests in reverse order, to show none depends on another having run first")


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Two workers share the 2 cores: one torch thread each, not two spinning OpenMP threads apiece.
        import torch

        torch.set_num_threads(1)


def longest_files_first(items: list) -> None:
    """Order ``items`` file by file, the longest files first as ``tests/durations.json`` (a past run's seconds per
    file, ``scripts/run_tests.py --save-durations``) has them, a file it does not name first of all; a file's own
    tests keep their order. pytest-xdist's ``--dist loadfile`` hands the files out in this order, so the long ones
    start early instead of leaving one worker busy at the end while the other waits."""
    import json
    from pathlib import Path

    path = Path(__file__).with_name("durations.json")
    try:
        seconds = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    first_seen: dict[str, int] = {}
    for item in items:
        first_seen.setdefault(item.nodeid.split("::")[0], len(first_seen))

    def key(item) -> tuple[float, int]:
        name = item.nodeid.split("::")[0]
        return -float(seconds.get(name, float("inf"))), first_seen[name]
    items.sort(key=key)  # stable: a file's tests stay in order


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` skip cleanly, with the reason, on a machine without a CUDA GPU; in a pytest-xdist worker,
    the longest files first (``longest_files_first``); ``--order reverse``."""
    import torch

    if os.environ.get("PYTEST_XDIST_WORKER"):
        longest_files_first(items)
    if config.getoption("--order") == "reverse":
        items.reverse()
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none visible); runs on a GPU host")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def app_server(tmp_path_factory):
    """The real app, started as `make run` starts it, once per test process: the browser-test modules share it
    (each opens its own pages, so its own sessions). A module that needs other settings starts its own."""
    from harness.browser import AppServer

    folder = tmp_path_factory.mktemp("app")
    # Corpus runs of the pages go to a fresh folder, not the user's cache.
    server = AppServer(folder / "server.log", extra_env={"AE_CORPUS_DIR": str(folder / "corpus-runs")})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def app_url(app_server) -> str:
    return app_server.url


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium through Playwright; module-scoped so each module's Playwright loop ends."""
    from harness.browser import chromium

    yield from chromium()


@pytest.fixture(scope="session")
def smollm2_converted():
    """The bundled SmolLM2 converted from its GGUF once, before a server loads it (a browser test's first page would
    otherwise wait for the conversion)."""
    from model_core.models.bundled import ensure_bundled_decoder

    ensure_bundled_decoder()


@pytest.fixture(scope="session")
def tiny_decoders(tmp_path_factory) -> dict:
    """Every tiny decoder family (tests/tiny_models.py), built once: family -> saved folder."""
    from tiny_models import build_tiny_decoder

    root = tmp_path_factory.mktemp("tiny-decoders")
    return {family: build_tiny_decoder(family, root / family) for family in TINY_FAMILIES}


@pytest.fixture(params=TINY_FAMILIES)
def tiny_decoder(request, tiny_decoders):
    """One tiny decoder's folder (its name is the family); a test using it runs once per family."""
    return tiny_decoders[request.param]


def assert_page_ok(at, title: str) -> None:
    """A page after a run under AppTest: no exception, no ``st.error``, and ``title`` as its title."""
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    assert at.title[0].value == title, [t.value for t in at.title]
