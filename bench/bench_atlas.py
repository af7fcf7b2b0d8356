"""Benchmark the head atlas (``model_core.atlas``) on SmolLM2; print the figures.

Run: ``.venv/bin/python bench/bench_atlas.py [--n 100] [--max-tokens 128] [--qk-contexts 3]`` (a few minutes on 2
cores at 100 texts).

Each configuration runs in its own process (so its peak RSS is its own): the atlas over the first N texts of the demo
corpus (cut at ``--max-tokens``), once with the QK split and the direct logit effect at ``--qk-contexts`` contexts a
head, once without (``qk_contexts=0``). Printed: wall time of the scan and of the cards, peak RSS, the folder's size,
and a linear extrapolation to 1,000 texts (the scan and the per-context work grow with the texts; the weight-only
parts, composition, copying and the roles probe, do not). The demo corpus has 303 texts: past that, it repeats.

Then the check the issue asks for: Head roles' top-3 previous-token and induction heads (the probe's scores on the
cards) and the kind their atlas summary gives them.

Timings on a shared CPU are pessimistic: the machine's 2 cores are shared with other processes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
MODEL = "bundled:SmolLM2-135M-Instruct"


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _cpu() -> float:
    """CPU seconds of this process, user and system (a fairer figure than wall time on a shared machine)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def texts_of(n: int, join: int) -> tuple:
    """``n`` texts: the demo corpus's, one each (``join`` 1, about 10 tokens), or ``join`` consecutive ones run
    together (``join`` 12: about 120 tokens, the issue's texts of up to 128), each group starting one text later."""
    from model_core.corpus import demo_corpus

    demo = demo_corpus().texts
    if join <= 1:
        return tuple(demo[i % len(demo)] for i in range(n))
    return tuple((" ".join(demo[(i + j) % len(demo)][0] for j in range(join)), None) for i in range(n))


def child(n: int, max_tokens: int, qk_contexts: int, out: Path, threads: int, join: int = 1,
          qk_pick: str = "auto") -> dict:
    """One atlas run in this process: its timings, peak RSS and size."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    from model_core.atlas import AtlasOptions, run_atlas
    from model_core.corpus import Corpus, CorpusModel

    texts = texts_of(n, join)
    corpus = Corpus(f"demo x{n} (joined {join})", texts)
    model = CorpusModel("pretrained", MODEL)
    start = time.perf_counter()
    loaded = model.load("cpu")
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    cpu_start = _cpu()
    cpu_scan = []

    card_texts = [0]

    def progress(p) -> None:  # the CPU seconds the scan took: read at the cards' first tick
        if p.stage == "cards" and not cpu_scan:
            cpu_scan.append(_cpu() - cpu_start)
        if p.stage == "cards":
            card_texts[0] = max(card_texts[0], p.total)

    run = run_atlas(corpus, model, out, options=AtlasOptions(max_tokens=max_tokens, qk_contexts=qk_contexts,
                                                                     qk_pick=qk_pick),
                    loaded=loaded, progress=progress)
    wall = time.perf_counter() - start
    cpu_total = _cpu() - cpu_start
    from model_core.atlas.store import open_atlas

    start = time.perf_counter()
    open_atlas(out).show(loaded.n_layers - 1, 0)  # a card as `atlas --show` and the page open it: from the folder
    card_s = time.perf_counter() - start
    lengths = [min(len(loaded.tokenizer(a)["input_ids"]), max_tokens) for a, _ in texts]
    return {"n": n, "qk_contexts": qk_contexts, "qk_pick": qk_pick, "load_s": round(load_s, 2), "wall_s": round(wall, 1),
            "scan_s": run.manifest["timings"]["scan_s"], "cards_s": run.manifest["timings"]["cards_s"],
            "cpu_s": round(cpu_total, 1), "cpu_scan_s": round(cpu_scan[0], 1) if cpu_scan else None,
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024), "disk_mb":
            round(folder_bytes(out) / 1e6, 2), "mean_tokens": round(sum(lengths) / len(lengths), 1),
            "max_tokens_seen": max(lengths), "card_open_s": round(card_s, 3),
            "card_texts": card_texts[0]}


def roles_check(out: Path) -> list[str]:
    from model_core.atlas import open_atlas

    run = open_atlas(out)
    lines = []
    for role, kind in (("previous_token", "previous-token"), ("induction", "induction")):
        ranked = sorted(run.heads, key=lambda c: -(c["roles"][role] or -1))[:3]
        for card in ranked:
            ok = "yes" if card["kind"] == kind else "NO"
            lines.append(f"  {role:15s} L{card['layer']}H{card['head']} probe {card['roles'][role]:.3f}: "
                         f"summary kind {card['kind']!r} ({ok}): {card['summary']}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--qk-contexts", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads (default 0: torch's own, every core; 1 on a busy shared machine, where "
                             "two threads spin-wait for each other)")
    parser.add_argument("--join", type=int, default=1,
                        help="run this many consecutive demo texts together into one (12: about 120 tokens a text)")
    from model_core.atlas.picks import PICKS

    parser.add_argument("--qk-pick", choices=PICKS, default="auto",
                        help="which contexts a head the QK split reads (model_core.atlas.picks)")
    parser.add_argument("--only-qk", action="store_true", help="skip the run without the QK part")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.n, args.max_tokens, args.qk_contexts, Path(args.child), args.threads, args.join,
                                     args.qk_pick)))
        return
    root = Path(tempfile.mkdtemp(prefix="bench-atlas-"))
    results = {}
    for qk in (args.qk_contexts,) if args.only_qk else (args.qk_contexts, 0):
        out = root / f"qk{qk}"
        proc = subprocess.run([sys.executable, __file__, "--n", str(args.n), "--max-tokens", str(args.max_tokens),
                               "--qk-contexts", str(qk), "--threads", str(args.threads), "--join", str(args.join),
                               "--qk-pick", args.qk_pick,
                               "--child", str(out)], capture_output=True, text=True,
                              cwd=ROOT)
        if proc.returncode:
            sys.exit(proc.stderr[-3000:])
        results[qk] = json.loads(proc.stdout.strip().splitlines()[-1])
        r = results[qk]
        print(f"SmolLM2, {args.threads or 'default'} torch thread(s), {r['n']} demo texts (mean {r['mean_tokens']} tokens, longest {r['max_tokens_seen']}), "
              f"qk_contexts={qk} ({r['qk_pick']}, {r['card_texts']} texts traced again): {r['wall_s']} s (scan {r['scan_s']} s, cards {r['cards_s']} s; model load "
              f"{r['load_s']} s apart; CPU {r['cpu_s']} s, of which the scan {r['cpu_scan_s']} s), peak RSS {r['peak_rss_mb']} MB, {r['disk_mb']} MB on disk; a card opens in {r['card_open_s']} s", flush=True)
    with_qk, without = results[args.qk_contexts], results.get(0, results[args.qk_contexts])
    # The scan grows with the texts; the cards do not: the QK split and the logit effects read at most
    # qk_contexts x heads contexts whatever the corpus's size (each costs more in a longer text), and the rest of the
    # cards reads the weights and a fixed probe.
    scale = 1000 / args.n
    print(f"estimated at 1,000 texts of the same lengths (the scan x{scale:g}, the cards as they are): "
          f"{with_qk['scan_s'] * scale + with_qk['cards_s']:.0f} s with the QK part, "
          f"{without['scan_s'] * scale + without['cards_s']:.0f} s without (wall); CPU "
          f"{with_qk['cpu_scan_s'] * scale + with_qk['cpu_s'] - with_qk['cpu_scan_s']:.0f} s with, "
          f"{without['cpu_scan_s'] * scale + without['cpu_s'] - without['cpu_scan_s']:.0f} s without; disk at most "
          f"{with_qk['disk_mb'] * scale:.0f} MB (the parts grow with the texts; the cards do not)")
    print("Head roles' top-3 heads and their atlas summaries:")
    print("\n".join(roles_check(root / f"qk{args.qk_contexts}")))
    print("(2 cores shared with other processes: the timings are pessimistic.)")


if __name__ == "__main__":
    main()
