"""The model core on a CUDA GPU and on the CPU beside it, in one process: a random-weight model of a real shape.

Run: python bench/bench_gpu.py [--shape smollm2|llama-3.2-1b|qwen2.5-1.5b|llama-3.1-8b] [--quick]
                               [--devices cuda,cpu] [--dtype auto] [--tokenizer DIR] [--json FILE] [--profile N]

Prints, for each device (cuda is skipped with a message where there is none), warm (a first call untimed):
- a full trace at 512 tokens (the issue's GPU target: ≤ 0.1 s), and a compact trace at 4,096 (≤ 1 s);
- a QK pair at 512 tokens (the split of one head's score at the last query);
- EAP-IG(5) with its faithfulness curve on 64 IOI pairs (≤ 3 s on a GPU);
- a corpus batch of 256 texts (per-head statistics);
each with its seconds and its peak memory: ``torch.cuda.max_memory_allocated`` on the GPU, the process's peak RSS
on the CPU (reset before each step through /proc/self/clear_refs), then the CPU/GPU ratios. ``--quick``: 2,048
tokens for the compact trace, 16 pairs with 2 steps, 64 texts. With $OUT set (the device machine), JSON lines go to
$OUT/bench_gpu.jsonl as well.

The model is built from its config with random weights (nothing is downloaded): speed and memory do not need trained
weights. The tokenizer is SmolLM2's (the bundled model's folder, or ``--tokenizer``: /work/shared/gpu's
``.gpu/smol_cfg`` on the GPU machine), whose ids fit every shape's vocabulary. The 8B shape runs on the CPU only
when ``--devices`` names cpu (32 GB in float32).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.shapes import SHAPES

BIG_FOR_CPU = ("llama-3.1-8b",)

WORDS = ["the", "river", "ran", "past", "an", "old", "mill", "where", "Mary", "and", "John", "kept", "a", "small", "boat", "that", "they", "painted", "blue", "every", "spring", "while", "their", "neighbours", "watched", "from", "a", "bench", "near", "the", "bridge", "and", "talked", "about", "the", "weather"]


def text_of(n_words: int, seed: int) -> str:
    import numpy as np

    return " ".join(np.random.default_rng(seed).choice(WORDS, n_words))


# -- memory -----------------------------------------------------------------------------------------------------------
def reset_peak(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    else:
        try:  # "5" resets the process's peak RSS (VmHWM) to its current RSS (Linux)
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            pass


def peak_mb(device: str) -> float | None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() / 2**20
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- the model ----------------------------------------------------------------------------------------------------------
def tokenizer_folder(given: str | None) -> str:
    if given:
        return given
    from model_core.models import bundled

    return str(bundled.ensure_bundled_decoder())


def build_model(shape: str, device: str, dtype_setting: str, tokenizer: Any) -> Any:
    """A ``LoadedModel`` of ``shape`` with seeded random weights, made on ``device`` (no host copy of a GPU's)."""
    import torch
    import transformers

    from model_core.families import family_of_type
    from model_core.families.capture import use_capture
    from model_core.families.hook_install import install_hook_points
    from model_core.models.loading import (
        LoadedModel,
        ModelSource,
        count_parameters,
        model_dtype,
    )

    fields = dict(SHAPES[shape])
    config = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
    family = family_of_type(config.model_type)
    n = count_parameters(config, family)
    dtype = model_dtype(dtype_setting, n, torch.device(device))
    torch.manual_seed(0)
    with torch.device(device):
        model = getattr(transformers, family.auto_class).from_config(config, attn_implementation="eager",
                                                                     dtype=dtype)
    model = use_capture(model.eval(), family.layers(model))
    install_hook_points(model, family, family.n_layers(model.config))
    for p in model.parameters():
        p.requires_grad_(False)
    return LoadedModel(model, tokenizer, ModelSource(f"shape:{shape}", "folder", f"random {shape}"),
                       torch.device(device)), n, dtype


# -- the steps ----------------------------------------------------------------------------------------------------------
def timed(device: str, fn: Callable[[], Any], repeat: int = 1) -> tuple[list[float], float | None, Any]:
    """``fn`` once untimed (warm), then ``repeat`` times timed; the peak memory of the timed calls."""
    import torch

    out = fn()
    reset_peak(device)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times, peak_mb(device), out


def profiled(device: str, fn: Callable[[], Any], n: int) -> list[dict[str, Any]]:
    """One call of ``fn`` under cProfile: its ``n`` costliest functions by own time, where each is and its calls."""
    import cProfile
    import pstats

    import torch

    profile = cProfile.Profile()
    profile.enable()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    profile.disable()
    stats = pstats.Stats(profile).stats  # (file, line, name) -> (calls, primitive calls, own, cumulative, callers)
    rows = sorted(stats.items(), key=lambda item: -item[1][2])[:n]
    return [dict(where=f"{Path(file).name}:{line}({name})", calls=calls, own_s=round(own, 4), cum_s=round(cum, 4))
            for (file, line, name), (calls, _, own, cum, _) in rows]


def steps(loaded: Any, quick: bool) -> dict[str, Callable[[], Any]]:
    from model_core.circuits.datasets import load_dataset
    from model_core.circuits.eap import circuit_model
    from model_core.circuits.run import run_circuit
    from model_core.compact.build import build_compact
    from model_core.corpus.batches import encode_texts, plan_batches
    from model_core.corpus.model import CorpusModel, LoadedCorpusModel
    from model_core.qk.terms import qk_terms
    from model_core.trace.forward import trace_pretrained
    from model_core.trace.request import TraceRequest
    from model_core.trace.resolve import Models

    family, tok = loaded.family, loaded.tokenizer
    models = Models(pretrained=lambda _id, _device: loaded)
    long_tokens = 2048 if quick else 4096
    pairs, ig_steps, n_texts = (16, 2, 64) if quick else (64, 5, 256)
    full = family.encode(tok, text_of(600, 1), max_tokens=512, truncate=True)
    long_request = TraceRequest("pretrained", text_of(int(long_tokens * 1.2), 2), "", model_id=loaded.source.model_id,
                                truncate=True)
    cm = circuit_model(loaded.model, tok)
    dataset = load_dataset(f"ioi:{pairs}:0")
    corpus_model = LoadedCorpusModel.build(CorpusModel("pretrained", loaded.source.model_id), loaded.model, tok,
                                           loaded.description)
    texts, _ = encode_texts(tok, [(text_of(60, 100 + i), None) for i in range(n_texts)], 0, 128, "truncate", family)
    layer, head = family.n_layers(loaded.model.config) // 2, 0

    def corpus_batch() -> int:
        from model_core.corpus.batches import batch_stats

        n = 0
        for batch in plan_batches(texts, n_texts, corpus_model.n_layers * corpus_model.n_heads):
            n += len(batch_stats(corpus_model, batch)[0])
        return n

    return {
        "trace 512 (full)": lambda: trace_pretrained(loaded, full),
        f"trace {long_tokens} (compact)": lambda: build_compact(long_request, device=loaded.device, models=models,
                                                                max_tokens=long_tokens),
        "QK pair 512": lambda: qk_terms(loaded.model, tok, full.input_ids, layer, head, -1),
        f"EAP-IG({ig_steps}) + curve, {pairs} IOI pairs": lambda: run_circuit(cm, dataset, method="eap-ig",
                                                                             steps=ig_steps, curve=True),
        f"corpus batch, {n_texts} texts": corpus_batch,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="smollm2", choices=sorted(SHAPES))
    parser.add_argument("--quick", action="store_true", help="smaller sizes (see the module docstring)")
    parser.add_argument("--devices", default=None, help="comma-separated, in order (default cuda,cpu; the 8B shape "
                                                        "runs on the CPU only when named here)")
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"))
    parser.add_argument("--tokenizer", default=None, help="a folder with SmolLM2's tokenizer (default: the bundled)")
    parser.add_argument("--only", default="", help="comma-separated words: run only the steps whose name has one")
    parser.add_argument("--json", default=None, help="also write JSON lines here")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="after each step's timing, one more call under cProfile: its N costliest functions "
                             "by own time (set CUDA_LAUNCH_BLOCKING=1 so a GPU's kernels count where they start)")
    args = parser.parse_args()

    import torch
    from transformers import AutoTokenizer

    sinks = [open(args.json, "a")] if args.json else []
    if os.environ.get("OUT"):
        sinks.append(open(Path(os.environ["OUT"]) / "bench_gpu.jsonl", "a"))

    def say(**record: Any) -> None:
        for sink in sinks:
            sink.write(json.dumps(record) + "\n")
            sink.flush()

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder(args.tokenizer))
    devices = [d.strip() for d in (args.devices or "cuda,cpu").split(",") if d.strip()]
    print(f"shape {args.shape}, torch {torch.__version__}, threads {torch.get_num_threads()}, load "
          f"{os.getloadavg()[0]:.1f}, {'quick' if args.quick else 'full'} sizes")
    results: dict[tuple[str, str], float] = {}
    for device in devices:
        if device == "cuda" and not torch.cuda.is_available():
            print("cuda: skipped, no CUDA GPU visible")
            say(device="cuda", skipped="no CUDA GPU visible")
            continue
        if device == "cpu" and args.shape in BIG_FOR_CPU and args.devices is None:
            print(f"cpu: skipped for {args.shape} (float32 on the CPU; name it in --devices to run it)")
            continue
        t0 = time.perf_counter()
        loaded, n, dtype = build_model(args.shape, device, args.dtype, tokenizer)
        name = torch.cuda.get_device_name(0) if device == "cuda" else f"{os.cpu_count()} CPU cores"
        print(f"\n{device} ({name}): {n / 1e6:,.0f} M parameters in {str(dtype).removeprefix('torch.')}, "
              f"built in {time.perf_counter() - t0:.1f} s")
        for label, fn in steps(loaded, args.quick).items():
            if args.only and not any(word in label for word in args.only.split(",")):
                continue
            try:
                times, peak, _ = timed(device, fn, repeat=2 if label.startswith("trace") else 1)
            except Exception as exc:  # a step that fails (memory) is reported, the others still run
                print(f"  {label:<34} failed: {type(exc).__name__}: {str(exc)[:160]}")
                say(device=device, step=label, error=repr(exc)[:300])
                continue
            best = min(times)
            results[(device, label)] = best
            memory = "GPU peak" if device == "cuda" else "peak RSS"
            print(f"  {label:<34} {best:8.3f} s   {memory} {peak:,.0f} MB")
            say(device=device, shape=args.shape, step=label, seconds=[round(t, 4) for t in times],
                peak_mb=None if peak is None else round(peak), dtype=str(dtype), quick=args.quick)
            if args.profile:
                top = profiled(device, fn, args.profile)
                for row in top:
                    print(f"      {row['own_s']:7.3f} s own {row['cum_s']:7.3f} s cum {row['calls']:>7}  {row['where']}")
                say(device=device, step=label, profile=top)
        del loaded
        if device == "cuda":
            torch.cuda.empty_cache()
    labels = sorted({label for _, label in results})
    if any(("cuda", label) in results and ("cpu", label) in results for label in labels):
        print("\nCPU / GPU:")
        for label in labels:
            if ("cuda", label) in results and ("cpu", label) in results:
                ratio = results[("cpu", label)] / results[("cuda", label)]
                print(f"  {label:<34} {ratio:6.1f}x")
                say(step=label, cpu_over_gpu=round(ratio, 2))


if __name__ == "__main__":
    main()
