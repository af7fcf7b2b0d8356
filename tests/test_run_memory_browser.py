"""Uploads the server cannot hold, in the real browser on the Circuits page with SmolLM2: a pair of about 6,000 tokens
is refused before Run, with the estimate and the limit (the issue's upload grew the server to 23.5 GB); a 10 MB file
of 60,000 pairs runs only its first AE_MAX_PAIRS, and the page says so with the time the run will take. The server
lives through both and its memory stays below AE_RUN_MEMORY_MB. While a circuit run goes in one tab, another user's
page opens and draws its figure (the run takes the gate pass by pass)."""

from __future__ import annotations

import json
import re
from urllib.parse import urlencode

import pytest

from harness.browser import CHROMIUM, CHROMIUM_MISSING, AppServer, wait_for_run
from model_core.settings import BUNDLED_DECODER_ID, load_settings

# Not serial: nothing here is timed, the server is the module's own, and its RSS is its own (the limit holds whatever
# runs beside it). In the serial phase it took 53 s with a core idle.
pytestmark = [pytest.mark.browser, pytest.mark.slow]

LINK = urlencode({"model": "pretrained", "model_id": BUNDLED_DECODER_ID})
TIMEOUT_S = 300
LONG = "When Mary and John went to the store, John gave a drink to"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not CHROMIUM.exists():
        pytest.skip(CHROMIUM_MISSING)
    from model_core.models.bundled import ensure_bundled_decoder

    ensure_bundled_decoder()  # converted once, before the server's first page asks for it
    server = AppServer(tmp_path_factory.mktemp("run-memory") / "server.log")
    yield server
    server.stop()


def _circuits(browser, server):
    context = browser.new_context(viewport={"width": 1400, "height": 1100})
    page = context.new_page()
    page.goto(f"{server.url}/circuits?{LINK}", wait_until="domcontentloaded")
    wait_for_run(page, TIMEOUT_S, text="Pairs from")
    return context, page


def _upload(page, path) -> None:
    page.get_by_text("My file (JSONL or CSV)").click()
    wait_for_run(page, TIMEOUT_S, text="Upload a file of pairs")
    page.locator('[data-testid="stMain"] [data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(path))


def _alive_and_within_the_limit(server) -> None:
    assert server.proc.poll() is None, server.log_tail()
    limit = load_settings().run_memory_mb
    assert server.rss_mb() < limit, (server.rss_mb(), limit)


def test_a_6000_token_pair_is_refused_with_the_estimate_and_the_limit(server, browser, tmp_path):
    clean = " ".join([LONG] * 430) + " Mary and John went on, and John gave it to"
    pair = {"clean": clean, "corrupt": clean.replace("Mary", "Anne"), "answer": " Mary", "foil": " John"}
    path = tmp_path / "long_pair.jsonl"
    path.write_text(json.dumps(pair) + "\n")
    context, page = _circuits(browser, server)
    try:
        _upload(page, path)
        wait_for_run(page, TIMEOUT_S, text="would need about")
        text = page.locator('[data-testid="stMain"]').inner_text()
        tokens = int(re.search(r"a pair of ([\d,]+) tokens", text).group(1).replace(",", ""))
        assert 5_500 < tokens < 7_000, tokens
        estimate = int(re.search(r"would need about ([\d,]+) MB", text).group(1).replace(",", ""))
        limit = int(re.search(r"limit of ([\d,]+) MB for one run \(AE_RUN_MEMORY_MB\)", text).group(1)
                    .replace(",", ""))
        assert estimate > limit == int(load_settings().run_memory_mb)
        assert page.get_by_role("button", name=re.compile(r"^Run EAP")).count() == 0  # nothing to press
        assert page.locator('[data-testid="stException"]').count() == 0
        _alive_and_within_the_limit(server)
    finally:
        context.close()


def test_a_10_mb_file_of_60000_pairs_runs_its_first_256_and_says_how_long(server, browser, tmp_path):
    row = {"clean": "When Mary and John went to the store, John gave a drink to",
           "corrupt": "When Mary and John went to the store, Mary gave a drink to", "answer": " Mary", "foil": " John"}
    line = json.dumps(row)
    path = tmp_path / "many.jsonl"
    path.write_text("\n".join([line] * 60_000) + "\n")
    assert path.stat().st_size > 10_000_000
    context, page = _circuits(browser, server)
    try:
        _upload(page, path)
        wait_for_run(page, TIMEOUT_S, text="this page runs the first 256")
        text = page.locator('[data-testid="stMain"]').inner_text()
        assert "has 60,000 rows" in text and "leaves out the other 59,744" in text
        assert re.search(r"The run will take about [\d.]+ (s|min|h) on this server now", text), text
        assert page.get_by_role("button", name="Run EAP-IG on 256 pairs").count() == 1
        assert page.locator('[data-testid="stException"]').count() == 0
        _alive_and_within_the_limit(server)
    finally:
        context.close()


def test_another_users_page_draws_while_a_circuit_runs(server, browser):
    running, page = _circuits(browser, server)
    other = browser.new_context(viewport={"width": 1400, "height": 1100})
    try:
        page.get_by_text("EAP (one gradient)").click()
        wait_for_run(page, TIMEOUT_S, text="The run will take")
        count = page.get_by_label("Pairs", exact=True)
        count.fill("256")
        count.press("Enter")
        wait_for_run(page, TIMEOUT_S, text="Run EAP on 256 pairs")
        page.get_by_role("button", name="Run EAP on 256 pairs").click()
        page.locator('[data-testid="stProgress"]').first.wait_for(timeout=TIMEOUT_S * 1000)
        second = other.new_page()
        second.goto(f"{server.url}/heatmaps?{LINK}", wait_until="domcontentloaded")
        second.locator('[data-testid="stPlotlyChart"]').first.wait_for(timeout=TIMEOUT_S * 1000)
        # the run is still going: its progress bar and Stop button are there while the other page has its figure
        assert page.locator('[data-testid="stProgress"]').count() == 1
        stop = page.locator(".st-key-circ_stop button").first  # the run's own Stop (a stale copy may fade beside it)
        assert stop.is_visible()
        stop.click()
        wait_for_run(page, TIMEOUT_S, text="Run EAP")  # stopped: the button again (with a partial result, if any)
        assert page.locator('[data-testid="stException"]').count() == 0
        _alive_and_within_the_limit(server)
    finally:
        other.close()
        running.close()
