"""Every press on every page with the bundled SmolLM2, as ``test_press_everything_decoder_browser`` does, with the app
server's model on a simulated CUDA GPU (``tests/gpu_sim.py``) in bfloat16, the precision a GPU gives a model over 1B
parameters: no page and no press may mix the model's device with the host's, hand a GPU tensor to numpy, or mix a
half-precision model with float32 inputs, where a user with a GPU would get an error."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlencode

import pytest

from harness.browser import CHROMIUM, CHROMIUM_MISSING, AppServer
from harness.press import PRESS_ENV, drew_or_said, press_in_a_new_tab
from model_core.settings import BUNDLED_DECODER_ID

pytestmark = [pytest.mark.browser, pytest.mark.slow]

if not CHROMIUM.exists():
    pytest.skip(CHROMIUM_MISSING, allow_module_level=True)

SITE = Path(__file__).resolve().parent / "sim_site"
MIN_PRESSES = 40


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from model_core.models.bundled import ensure_bundled_decoder

    ensure_bundled_decoder()
    folder = tmp_path_factory.mktemp("press-gpu")
    path = os.pathsep.join([str(SITE), *filter(None, [os.environ.get("PYTHONPATH")])])
    server = AppServer(folder / "server.log", extra_env={**PRESS_ENV, "AE_CORPUS_DIR": str(folder / "runs"),
                                                         "AE_TEST_SIMULATED_CUDA": "1", "PYTHONPATH": path,
                                                         "AE_DTYPE": "bfloat16"})
    yield server
    server.stop()


def on_the_gpu(page, title: str) -> list[str]:
    """Each page opens with its figure or note, and the sidebar's trace caption says the model is on cuda, in
    bfloat16."""
    problems = drew_or_said(page, title)
    sidebar = page.locator('section[data-testid="stSidebar"]').inner_text()
    if "on cuda" not in sidebar or "bfloat16" not in sidebar:
        problems.append("the sidebar does not say the model is on cuda in bfloat16")
    return problems


def test_every_press_on_every_page_with_the_decoder_on_a_gpu(server, browser):
    link = urlencode({"model": "pretrained", "model_id": BUNDLED_DECODER_ID})
    report = press_in_a_new_tab(browser, server, f"{server.url}/?{link}", on_open=on_the_gpu)
    print(report.summary())
    assert not report.failures, report.summary() + "\n" + server.log_tail(6000)
    assert len(report.presses) >= MIN_PRESSES, report.summary()
