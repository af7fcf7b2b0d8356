"""Benchmark the query–key space and nearest contexts.

Run: ``.venv/bin/python bench/bench_space.py [--tokens 100000] [--ivf 1200000] [--skip-browser]``

1. **Index**: a corpus run of generated texts with ``--index --sample-cap TOKENS`` (the bundled BERT), then the
   time to build the per-layer indexes (from the manifest), their size, and the median time per query
   (``neighbours_of``, 200 queries, the last layer).
2. **Approximate index**: ``--ivf`` vectors made from the run's real hidden states (copies with small noise),
   an IVF index as the run builds past 1,000,000 tokens, and its recall@10 against the exact index.
3. **Projection**: PCA of 20,000 queries + 20,000 keys of one head, and the 800-token grid of a whole layer.
4. **Browser**: the app opens that run folder on the Corpus page, then the Query–key space page, in headless
   Chromium: time until every figure is drawn, time for a head change and for a layer change (its scatter and the
   grid of all its heads), and the server's RSS with the run open.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

from bench_corpus import generated_texts  # noqa: E402


def make_run(tokens: int, folder: Path):
    from model_core.corpus import Corpus, CorpusModel, RunOptions, run_corpus

    texts = generated_texts(tokens // 38 + 50, seed=1)
    corpus = Corpus("generated", tuple((t, None) for t in texts))
    t = time.perf_counter()
    run = run_corpus(corpus, CorpusModel.from_options("bert"), folder,
                     options=RunOptions(sample_cap=tokens, keep_qk=True, index=True))
    return run, time.perf_counter() - t


def index_figures(run) -> dict:
    from model_core.corpus.model import CorpusModel
    from model_core.corpus.neighbours import neighbours_of, token_states

    info = run.manifest["sample"]["index"]
    loaded = CorpusModel.from_key(run.manifest["model"]).load()
    queries = generated_texts(20, seed=9)
    states = [token_states(loaded, q) for q in queries]
    last = info["layers"] - 1
    neighbours_of(run, states[0][1], states[0][0], position=1, layer=last, k=10)  # load the index once
    times = []
    for i in range(200):
        tokens, s = states[i % len(states)]
        t = time.perf_counter()
        neighbours_of(run, s, tokens, position=1 + i % (len(tokens) - 2), layer=last, k=10)
        times.append(time.perf_counter() - t)
    return {"tokens": info["tokens"], "layers": info["layers"], "index_kind": info["kind"],
            "build_s_all_layers": info["seconds"], "build_s_per_layer": round(info["seconds"] / info["layers"], 3),
            "index_mb_all_layers": round(info["bytes"] / 2**20, 1),
            "query_ms_median": round(1000 * statistics.median(times), 2),
            "query_ms_p95": round(1000 * float(np.percentile(times, 95)), 2)}


def ivf_recall(run, n: int) -> dict:
    from model_core.corpus.index import build_index, normalised
    from model_core.corpus.sample import read_array

    base = read_array(run.path, "hidden")[-1].astype(np.float32)
    rng = np.random.default_rng(0)
    copies = -(-n // len(base))
    scale = 0.05 * base.std()
    vectors = np.concatenate([base + rng.normal(0, scale, base.shape).astype(np.float32) for _ in range(copies)])[:n]
    t = time.perf_counter()
    exact = build_index(vectors, ivf_from=n + 1)
    exact_s = time.perf_counter() - t
    t = time.perf_counter()
    ivf = build_index(vectors, ivf_from=1)
    ivf_s = time.perf_counter() - t
    queries = normalised(vectors[rng.choice(n, 200, replace=False)] + rng.normal(0, scale, (200, vectors.shape[1])))
    t = time.perf_counter()
    _, truth = exact.search(queries, 10)
    exact_q = (time.perf_counter() - t) / 200
    t = time.perf_counter()
    _, approx = ivf.search(queries, 10)
    ivf_q = (time.perf_counter() - t) / 200
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(approx, truth)])
    return {"vectors": n, "dim": int(vectors.shape[1]), "exact_build_s": round(exact_s, 2), "ivf_build_s": round(ivf_s, 2),
            "nlist": int(ivf.nlist), "nprobe": int(ivf.nprobe), "recall_at_10": round(float(recall), 4),
            "exact_query_ms": round(1000 * exact_q, 2), "ivf_query_ms": round(1000 * ivf_q, 2)}


def projection_figures(run) -> dict:
    from model_core.corpus.qk_space import head_vectors, joint_projection

    n_heads = run.shape[1]
    t = time.perf_counter()
    q, k = head_vectors(run.path, 5, 3, n_heads)
    p = joint_projection(q, k, method="pca")
    one = time.perf_counter() - t
    t = time.perf_counter()
    for h in range(n_heads):
        joint_projection(*head_vectors(run.path, 5, h, n_heads), limit=800, seed=h)
    grid = time.perf_counter() - t
    return {"points": int(len(p.coords)), "pca_one_head_s": round(one, 3), "layer_grid_s": round(grid, 3)}


def browser_figures(run_dir: Path) -> dict:
    from harness.browser import AppServer, chromium, nav_to, wait_for_run

    folder = Path(tempfile.mkdtemp())
    server = AppServer(folder / "server.log", extra_env={"AE_CORPUS_DIR": str(folder / "runs")})
    out = {}
    try:
        for browser in chromium():
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{server.url}/corpus", wait_until="domcontentloaded")
            wait_for_run(page, 300)
            page.get_by_text("Open a run folder").click()
            wait_for_run(page, 300)
            page.get_by_role("textbox", name="Run folder").fill(str(run_dir))
            page.get_by_role("textbox", name="Run folder").press("Enter")
            page.get_by_text("Pattern type (heuristic)").wait_for(timeout=300_000)
            wait_for_run(page, 300)
            t = time.perf_counter()
            nav_to(page, "Query–key space & nearest contexts")
            page.get_by_text("Layer 0, head 0: ").wait_for(timeout=300_000)
            wait_for_run(page, 300, quiet_s=0.5)
            out["space_page_open_s"] = round(time.perf_counter() - t - 0.5, 2)
            out["server_rss_mb_with_run_open"] = round(server.rss_mb(), 1)
            combo = page.locator('[data-testid="stMain"] input[role="combobox"][aria-label="Head"]')
            times, titled = [], []
            for head in (3, 7, 5):
                combo.click()
                page.locator(f'[role="listbox"] [role="option"][data-key="{head}"]').click()
                t = time.perf_counter()
                page.get_by_text(f"Layer 0, head {head}: ").wait_for(timeout=120_000)
                titled.append(time.perf_counter() - t)
                wait_for_run(page, 300, quiet_s=0.5)
                times.append(time.perf_counter() - t - 0.5)
            out["head_change_s"] = [round(x, 2) for x in times]
            out["head_change_until_title_s"] = [round(x, 2) for x in titled]
            # A layer change: the scatter of the new layer and the projections of all its heads (the grid).
            combo = page.locator('[data-testid="stMain"] input[role="combobox"][aria-label="Layer"]')
            times = []
            for layer in (3, 5):
                combo.click()
                page.locator(f'[role="listbox"] [role="option"][data-key="{layer}"]').click()
                t = time.perf_counter()
                page.get_by_text(f"Layer {layer}: every head").wait_for(timeout=120_000)
                page.get_by_text(f"Layer {layer}, head 5: ").wait_for(timeout=120_000)
                wait_for_run(page, 300, quiet_s=0.5)
                times.append(time.perf_counter() - t - 0.5)
            out["layer_change_with_grid_s"] = [round(x, 2) for x in times]
    finally:
        server.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=100_000)
    parser.add_argument("--ivf", type=int, default=1_200_000)
    parser.add_argument("--skip-browser", action="store_true")
    parser.add_argument("--browser-only", action="store_true", help="only step 4, on a new 20,000-token run")
    args = parser.parse_args()
    if args.browser_only:
        folder = Path(tempfile.mkdtemp()) / "run20k"
        make_run(20_000, folder)
        print(json.dumps({"browser": browser_figures(folder)}), flush=True)
        return
    folder = Path(tempfile.mkdtemp()) / "run"
    run, seconds = make_run(args.tokens, folder)
    print(json.dumps({"run": str(folder), "texts": run.n_texts, "run_s": round(seconds, 1),
                      "sample_mb": round(sum(p.stat().st_size for p in (folder / "sample").iterdir()) / 2**20, 1)}),
          flush=True)
    print(json.dumps({"index": index_figures(run)}), flush=True)
    if args.ivf:
        print(json.dumps({"ivf": ivf_recall(run, args.ivf)}), flush=True)
    # The page's default: a 20,000-token sample (20,000 queries + 20,000 keys per head).
    small_folder = Path(tempfile.mkdtemp()) / "run20k"
    small, seconds = make_run(20_000, small_folder)
    print(json.dumps({"run20k_s": round(seconds, 1), "projection": projection_figures(small)}), flush=True)
    if not args.skip_browser:
        print(json.dumps({"browser": browser_figures(small_folder)}), flush=True)


if __name__ == "__main__":
    main()
