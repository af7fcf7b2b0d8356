"""Benchmark corpus mode: a corpus run against the bare batched forward passes of the same texts, the
throughput on the demo corpus and on 20,000 generated texts, and peak memory for 1,000 vs 20,000 texts.

Run: ``.venv/bin/python bench/bench_corpus.py [--models bert custom custom+bert] [--big 20000] [--repeat 3]``

* **overhead**: for each model, the same texts are tokenised, sorted and packed into the same padded batches
  as a corpus run packs them, and only the forward passes are timed ("bare"); then a whole corpus run
  (reading, tokenising, forward, statistics, parquet, npz, manifest) of the same texts into a new folder is
  timed. Both in this process, alternating, ``--repeat`` times; medians and their ratio are printed.
* **throughput and memory**: ``python -m model_core corpus`` on ``--small`` and ``--big`` generated texts of
  20 to 60 tokens, each in its own process, timing the run and reading the child's peak RSS.

Models: ``bert`` the bundled MiniLM-L6 BERT; ``custom`` the from-scratch encoder at bert-base shape
(12 x 12, hidden 768, random weights); ``custom+bert`` the from-scratch encoder with the bundled BERT's weights.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

WORDS = ("the a river bank money flies time arrow fruit banana bat cave ball dog bark tree light heavy "
         "train station watch night wave sea spring water key door lock song music plant power city "
         "old new small big quick slow red green blue children play run walk sing read write over under "
         "with from into near far because although when while and or but not never always").split()


def generated_texts(n: int, seed: int = 0) -> list[str]:
    """``n`` texts of 18 to 58 words (about 20 to 60 tokens with [CLS] and [SEP])."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(18, 58))) + "." for _ in range(n)]


def model_for(name: str):
    from model_core.corpus import CorpusModel

    if name == "bert":
        return CorpusModel.from_options("bert")
    if name == "custom":
        return CorpusModel.from_options("custom")
    if name == "custom+bert":
        return CorpusModel.from_options("custom", weights="pretrained")
    raise SystemExit(f"unknown model {name!r}")


def cli_args(name: str) -> list[str]:
    return {"bert": ["--model", "bert"], "custom": ["--model", "custom"],
            "custom+bert": ["--model", "custom", "--weights", "pretrained"]}[name]


def overhead(name: str, repeat: int) -> dict:
    """Median bare forward passes vs a whole corpus run, over the demo corpus, in this process."""
    import torch

    from model_core.corpus import RunOptions, demo_corpus, run_corpus
    from model_core.corpus.batches import encode_texts, pad_batch, plan_batches

    model = model_for(name)
    loaded = model.load("auto")
    corpus = demo_corpus()
    options = RunOptions()
    batches = []
    for start in range(0, len(corpus), options.chunk_size):
        texts = list(corpus.texts[start:start + options.chunk_size])
        encoded, _ = encode_texts(loaded.tokenizer, texts, start, options.max_tokens, options.long)
        for batch in plan_batches(encoded, options.batch_size, loaded.n_layers * loaded.n_heads):
            batches.append(pad_batch(batch, loaded.tokenizer.pad_token_id or 0, loaded.device)[:3])

    def bare() -> float:
        t = time.perf_counter()
        for ids, types, mask in batches:
            loaded.layer_weights(ids, types, mask)
        if loaded.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t

    def whole() -> float:
        folder = Path(tempfile.mkdtemp()) / "run"
        t = time.perf_counter()
        run_corpus(corpus, model, folder, options=options, loaded=loaded)
        if loaded.device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t
        shutil.rmtree(folder.parent)
        return elapsed

    bare(), whole()  # warm-up: first-touch memory, tokenizer caches
    bares, wholes = [], []
    for _ in range(repeat):
        bares.append(bare())
        wholes.append(whole())
    b, w = statistics.median(bares), statistics.median(wholes)
    return {"model": name, "device": str(loaded.device), "texts": len(corpus), "bare_s": round(b, 3),
            "run_s": round(w, 3), "ratio": round(w / b, 2), "demo_texts_per_s": round(len(corpus) / w, 1)}


# The CLI in a process that prints its own peak RSS when it ends. VmHWM, not ru_maxrss: Linux carries
# ru_maxrss across fork + exec, so a child of this (model-laden) process would report this process's peak.
PEAK_WRAPPER = ("import re, sys; from model_core.__main__ import main; rc = main(sys.argv[1:]); "
                "hwm = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1); "
                "print('PEAK_KB', hwm, file=sys.stderr); sys.exit(rc)")


def cli_run(name: str, n: int, data: Path) -> dict:
    """One CLI run in its own process: wall time, texts/s, the child's peak RSS."""
    out = Path(tempfile.mkdtemp()) / "run"
    t = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", PEAK_WRAPPER, "corpus", "--input", str(data), "--limit", str(n),
                             "--quiet", "--out", str(out), *cli_args(name)], cwd=ROOT, capture_output=True, text=True)
    elapsed = time.perf_counter() - t
    if result.returncode != 0:
        raise SystemExit(result.stderr)
    peak = int(result.stderr.rsplit("PEAK_KB", 1)[1].split()[0])
    manifest = json.loads((out / "manifest.json").read_text())
    shutil.rmtree(out.parent)
    return {"model": name, "texts": n, "wall_s": round(elapsed, 1), "run_s": manifest["timings"]["seconds"],
            "texts_per_s": manifest["timings"]["texts_per_s"], "peak_rss_mb": round(peak / 1024, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["bert", "custom", "custom+bert"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--big", type=int, default=20000)
    parser.add_argument("--big-models", nargs="+", default=["bert", "custom+bert"],
                        help="models for the throughput/memory runs (bert-base shape on 20k texts takes ~an hour on 2 cores)")
    parser.add_argument("--skip-overhead", action="store_true")
    args = parser.parse_args()
    if not args.skip_overhead:
        print("## corpus run vs bare batched forward passes (demo corpus, same batches, same process)")
        for name in args.models:
            print(json.dumps(overhead(name, args.repeat)), flush=True)
    data = Path(tempfile.mkdtemp()) / "generated.txt"
    data.write_text("\n".join(generated_texts(max(args.small, args.big))))
    print(f"## throughput and peak memory, {args.small} vs {args.big} generated texts of 20-60 tokens (CLI, own process)")
    for name in args.big_models:
        small = cli_run(name, args.small, data)
        big = cli_run(name, args.big, data)
        print(json.dumps(small), flush=True)
        print(json.dumps(big), flush=True)
        print(json.dumps({"model": name, "peak_ratio_big_vs_small": round(big["peak_rss_mb"] / small["peak_rss_mb"], 3)}),
              flush=True)


if __name__ == "__main__":
    main()
