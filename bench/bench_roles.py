"""Benchmark the head-role probes and the Head roles page; print the figures.

Run: ``.venv/bin/python bench/bench_roles.py`` (about 3-5 minutes on 2 shared cores; ``--quick`` for one repeat,
``--no-browser`` for the probes alone).

* **probes**: ``score_roles`` on the bundled SmolLM2-135M (30 layers x 9 heads = 270 heads): previous-token,
  duplicate-token, induction and sink from 4 sequences of 50 words written twice (one padded batch through
  ``Family.forward``), the model loaded beforehand as the app's cached model is, with the server's number of
  torch threads (``ui.loaders.cpu_threads``). Target <= 10 s.
* **retrieval**: ``retrieval_scores`` on SmolLM2: 3 needle-in-a-haystack prompts of ~520 tokens, greedy decoding
  with the KV cache. Target <= 60 s.
* **page from a link**: the real app in headless Chromium. With the probe scores cached (the Head roles page
  opened once before), the Head roles page and the heatmaps page are each opened from a link in a new tab, with
  a new text each time (so each open runs the sidebar's forward pass), until every figure is drawn and the app
  is idle; medians of the repeats. Target: Head roles <= 1.5 x heatmaps.
* **screenshots**: the Head roles page with SmolLM2 and with MiniLM, full page, into ``screenshots/``
  (git-ignored), with the tallest figure's height.

Timings on a shared CPU are noisy: each is repeated and the median is printed with the range.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from harness.browser import CHROMIUM, AppServer, open_chromium

SMOL = "bundled:SmolLM2-135M-Instruct"
MINILM = "bundled:all-MiniLM-L6-v2"
TIMEOUT_MS = 240_000
READY_JS = """([minFigures, mustText]) => {
    const status = document.querySelector('[data-testid="stStatusWidget"]');
    if (status && /Running|Stop/i.test(status.innerText)) return false;
    if (document.querySelector('[data-stale="true"]') || document.querySelector('[data-testid="stSpinner"]')) return false;
    if (!document.body.innerText.includes(mustText)) return false;
    const plots = Array.from(document.querySelectorAll('.js-plotly-plot'));
    return plots.length >= minFigures && plots.every(gd => gd._fullData && gd.querySelector('.main-svg'));
}"""
TALLEST_JS = """() => Math.max(0, ...Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd =>
    gd._fullLayout ? gd._fullLayout.height : 0))"""
FIGURES = {"heatmaps": 6, "head_roles": 1}  # heatmaps: overview, focused head, four summary grids


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} s (range {min(values):.2f}-{max(values):.2f}, n={len(values)})"


def bench_probes(repeat: int) -> dict:
    import torch

    from model_core import Models, TraceRequest
    from model_core.roles import retrieval_scores, score_roles
    from ui.loaders import cpu_threads  # the server's choice: half the cores

    torch.set_num_threads(cpu_threads())
    models = Models()
    request = TraceRequest("pretrained", model_id=SMOL)
    models.pretrained(SMOL, torch.device("cpu"))  # loaded beforehand, as the app's cached model is
    times, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        scores = score_roles(request, 0, models=models, device="cpu")
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    la, h, s = scores.top_heads("induction", 1)[0]
    print(f"probes, 270 SmolLM2 heads x 4 roles ({torch.get_num_threads()} torch thread(s)): {spread(times)}; "
          f"CPU {statistics.median(cpu):.2f} s; target <= 10 s", flush=True)
    print(f"  top induction L{la}H{h} {s:.2f}; top previous-token "
          f"L{scores.top_heads('previous_token', 1)[0][0]}H{scores.top_heads('previous_token', 1)[0][1]} "
          f"{scores.top_heads('previous_token', 1)[0][2]:.2f}; sink > 0.5: {(scores.scores['sink'] > 0.5).sum()} heads")
    t0 = time.perf_counter()
    result = retrieval_scores(request, 0, models=models, device="cpu")
    retrieval_s = time.perf_counter() - t0
    print(f"retrieval, 3 prompts of {result.n_tokens[0]} tokens, greedy with the KV cache: {retrieval_s:6.2f} s; "
          f"copied {sum(result.copied)} of {3 * result.answer_tokens} password tokens; target <= 60 s", flush=True)
    return {"probes_s": statistics.median(times), "retrieval_s": retrieval_s, "texts": scores.texts}


def n_tokens(model_id: str, text: str) -> int:
    from model_core.models.loading import load_pretrained

    loaded = load_pretrained(model_id, device="cpu")
    return len(loaded.family.encode(loaded.tokenizer, text, max_tokens=8192).tokens)


def open_link(context, origin: str, path: str, params: dict, n: int) -> tuple[float, object]:
    page = context.new_page()
    start = time.perf_counter()
    page.goto(f"{origin}/{path}?{urllib.parse.urlencode(params)}", wait_until="commit")
    page.wait_for_function(READY_JS, arg=[FIGURES[path], f"· {n} tokens"], polling=50, timeout=TIMEOUT_MS)
    return time.perf_counter() - start, page


def bench_pages(repeat: int, shots: Path) -> None:
    from model_core.models.loading import load_pretrained
    from model_core.roles import probe_texts

    tok = load_pretrained(SMOL, device="cpu").tokenizer
    texts = probe_texts(tok, 1000, 2 * repeat + 1, 50)  # a new probe-like text for every open
    server = AppServer(Path("/tmp/bench_roles_server.log"))
    try:
        with open_chromium() as browser:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            base = {"model": "pretrained", "model_id": SMOL, "text_b": "", "layer": "18", "head": "6"}
            t, page = open_link(context, server.origin, "head_roles", {**base, "text_a": texts[-1]}, n_tokens(SMOL, texts[-1]))
            page.close()
            print(f"Head roles page, first open (model load, probes, trace): {t:6.2f} s", flush=True)
            timing: dict[str, list[float]] = {"heatmaps": [], "head_roles": []}
            for i in range(repeat):
                for j, path in enumerate(("heatmaps", "head_roles")):
                    text = texts[2 * i + j]
                    t, page = open_link(context, server.origin, path, {**base, "text_a": text}, n_tokens(SMOL, text))
                    timing[path].append(t)
                    page.close()
            ratio = statistics.median(timing["head_roles"]) / statistics.median(timing["heatmaps"])
            print(f"heatmaps page from a link (SmolLM2, ~100 tokens): {spread(timing['heatmaps'])}", flush=True)
            print(f"Head roles page from a link, scores cached:       {spread(timing['head_roles'])}", flush=True)
            print(f"  ratio {ratio:.2f} (target <= 1.5)", flush=True)
            shots.mkdir(exist_ok=True)
            tall = browser.new_context(viewport={"width": 1400, "height": 3400})
            for label, model_id in (("smollm2", SMOL), ("minilm", MINILM)):
                text = "time flies like an arrow"
                params = {"model": "pretrained", "model_id": model_id, "text_a": text, "text_b": ""}
                # A tall window: Streamlit scrolls inside its main block, so a full-page shot is the window.
                t, page = open_link(tall, server.origin, "head_roles", params, n_tokens(model_id, text))
                tallest = page.evaluate(TALLEST_JS)
                height = page.evaluate("() => (document.querySelector('[data-testid=\"stMain\"]') || document.body).scrollHeight")
                path = shots / f"head_roles_{label}.png"
                page.screenshot(path=str(path), full_page=True)
                page.close()
                print(f"screenshot {path.relative_to(ROOT)}: opened in {t:.2f} s, tallest figure {tallest:.0f} px, "
                      f"page {height} px", flush=True)
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repeat")
    parser.add_argument("--no-browser", action="store_true", help="the probes alone")
    args = parser.parse_args()
    repeat = 1 if args.quick else 3
    bench_probes(repeat)
    if not args.no_browser:
        if not CHROMIUM.exists():
            print("Chromium not installed: apt-get install chromium; page timings skipped")
            return
        bench_pages(repeat, ROOT / "screenshots")


if __name__ == "__main__":
    main()
