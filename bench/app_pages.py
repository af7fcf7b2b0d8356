"""bench_app's heatmaps runs: new text and head changes per model and size, the bertviz page, and raw bertviz's
bytes beside ours."""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path

from harness.browser import AppServer
from harness.texts import text_of
from app_common import MODEL_PARAMS, MODEL_REQUESTS, TIMEOUT_MS, mb
from app_every_page import forward_seconds
from app_profile import BrowserProfile
from app_session import change_head, open_page, submit_text, submit_text_bertviz, wait_idle_figures

# -- raw bertviz bytes ---------------------------------------------------------------------------
def bertviz_bytes(model_label: str, n_tokens: int) -> dict[str, int | None]:
    """Bytes of raw bertviz's head and model views for the same input, and of ours if it exists."""
    import torch
    from bertviz import head_view, model_view

    from dataclasses import replace

    from model_core import build_trace

    trace = build_trace(replace(MODEL_REQUESTS[model_label], text_a=text_of(n_tokens, 0, model_label)))
    attention = tuple(torch.from_numpy(trace.weights[i].copy())[None] for i in range(trace.n_layers))
    tokens = list(trace.tokens)
    out: dict[str, int | None] = {
        "raw_head": len(head_view(attention, tokens, html_action="return").data.encode()),
        "raw_model": len(model_view(attention, tokens, html_action="return").data.encode()),
        "ours_head": None, "ours_model": None,
    }
    try:
        from attention_explorer import views as bv

        out["ours_head"] = len(bv.head_view_html(trace, layers=[0]).html.encode())
        out["ours_model"] = len(bv.model_view_html(trace).html.encode())
    except Exception as exc:  # noqa: BLE001 - the bertviz module is someone else's work in progress
        print(f"  (ours bertviz unavailable: {type(exc).__name__}: {exc})", flush=True)
    return out


def _repeat(repeat: int, what: str, measure) -> tuple[list[float], list[int]]:
    """Run ``measure`` (-> seconds, bytes, where the time went) ``repeat`` times, printing each run."""
    times, sizes = [], []
    for _ in range(repeat):
        seconds, size, split = measure()
        times.append(seconds)
        sizes.append(size)
        print(f"  {what} {seconds:.2f} s, {mb(size)} ({split})", flush=True)
    return times, sizes


def bench_pages(browser, server: AppServer, sizes: list[int], repeat: int, models: list[str],
                bertviz_page: bool = True, raw_bertviz: bool = True,
                browser_profile: Path | None = None) -> list[dict]:
    rows = []
    variants = itertools.count(101)  # a new text for every measurement, so each runs a forward pass
    for label in models:
        params = {**MODEL_PARAMS[label], "text_b": "", "text_a": text_of(13, 99, label)}
        context, page, meter = open_page(browser, server.origin, "heatmaps", params)
        wait_idle_figures(page)
        for n in sizes:
            times, sizes_b = _repeat(repeat, f"{label} {n} tokens: heatmaps page",
                                     lambda: submit_text(page, meter, text_of(n, next(variants), label), n))
            profiler = None
            if browser_profile is not None and n == max(sizes):
                slug = label.split()[0]
                profiler = BrowserProfile(page, browser_profile.with_name(
                    f"{browser_profile.stem}-{slug}-{n}{browser_profile.suffix or '.cpuprofile'}"))
            picks = itertools.count()
            heads, head_bytes = _repeat(
                repeat, f"{label} {n} tokens: head change",
                lambda: change_head(page, meter, head=1 + next(picks) % 11, profiler=profiler))
            if profiler is not None:
                print(f"\n  browser profile of the head changes ({label}, {n} tokens) -> {profiler.path}\n"
                      + profiler.save_and_summarise(), flush=True)
            forward = forward_seconds(label, text_of(n, 0, label))
            viz = bertviz_bytes(label, n) if raw_bertviz else dict.fromkeys(
                ("raw_head", "raw_model", "ours_head", "ours_model"))
            rows.append({"model": label, "n": n, "times": times, "bytes": statistics.median(sizes_b), "forward": forward,
                         "head_times": heads, "head_bytes": statistics.median(head_bytes), **viz})
        context.close()
        if not bertviz_page:
            continue
        # The bertviz page (head view, the sidebar's layer, all heads), up to 128 tokens.
        context, page, meter = open_page(browser, server.origin, "bertviz", params)
        page.wait_for_selector("iframe", timeout=TIMEOUT_MS)
        for n in [n for n in sizes if n <= 128]:
            times, sizes_b = _repeat(repeat, f"{label} {n} tokens: bertviz head view page",
                                     lambda: submit_text_bertviz(page, meter, text_of(n, next(variants), label), n))
            row = next(r for r in rows if r["model"] == label and r["n"] == n)
            row["bv_times"], row["bv_bytes"] = times, statistics.median(sizes_b)
        context.close()
    return rows
