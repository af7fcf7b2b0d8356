"""Benchmark: bertviz's views as Attention Explorer builds them, beside raw bertviz on the same input.

For the bundled BERT (6 layers x 12 heads) on sentence pairs of 13, 64 and 128 tokens it prints
the HTML bytes of each view and the time headless Chromium takes to draw it (navigation start to
the first painted frame with the SVG in place), for

* ours: ``attention_explorer.views`` (head view: one layer; model view: all layers and heads; neuron
  view: one layer), and
* raw: bertviz 1.4.1 called as its README shows (all layers; the neuron view through bertviz's
  forked BERT, fed the same weights saved as pytorch_model.bin), its CDN addresses rewritten to
  the same local files so that it can draw offline.

Run: ``.venv/bin/python bench/bench_bertviz.py [--sizes 13 64 128] [--timeout 120]``.
Needs /usr/bin/chromium and ``scripts/install_assets.sh`` to have run.
"""

from __future__ import annotations

import argparse
import http.server
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.browser import CHROMIUM, open_chromium  # noqa: E402 - the one launcher
from attention_explorer import views as bv  # noqa: E402
WORDS = ("the quick brown fox jumps over the lazy dog while a small bird sings in the old tree near the river "
         "and children play with a red ball on the green grass under the warm sun of a long summer day").split()
CDN = re.compile(r"https://cdnjs\.cloudflare\.com/ajax/libs/(require\.js|d3|jquery)/[^'\"]+?\.min(\.js)?(?=['\"])")


# -- inputs ----------------------------------------------------------------------------------------
def pair_texts(n_tokens: int) -> tuple[str, str]:
    """A sentence pair that the uncased WordPiece vocabulary splits into exactly ``n_tokens`` tokens."""
    if n_tokens == 13:
        return "time flies like an arrow", "fruit flies like a banana"
    words = n_tokens - 3  # [CLS] a [SEP] b [SEP]; every word in WORDS is one WordPiece
    n_a = words // 2
    seq = [WORDS[i % len(WORDS)] for i in range(words)]
    return " ".join(seq[:n_a]), " ".join(seq[n_a:])


def raw_views(trace, model_dir: Path, text_a: str, text_b: str) -> dict[str, str]:
    """Raw bertviz's three pages for the same input, CDN addresses pointed at the local files."""
    import torch
    from bertviz import head_view, model_view
    from bertviz.neuron_view import show
    from bertviz.transformers_neuron_view import BertModel, BertTokenizer

    attention = tuple(torch.from_numpy(trace.weights[layer].copy())[None] for layer in range(trace.n_layers))
    tokens = list(trace.tokens)
    pages = {
        "head": head_view(attention, tokens, trace.sentence_b_start, html_action="return").data,
        "model": model_view(attention, tokens, trace.sentence_b_start, html_action="return").data,
    }
    model = BertModel.from_pretrained(str(model_dir))
    tokenizer = BertTokenizer.from_pretrained(str(model_dir), do_lower_case=True)
    pages["neuron"] = show(model, "bert", tokenizer, text_a, text_b, html_action="return").data

    def local(m: re.Match[str]) -> str:
        return {"require.js": "app/static/vendor/require.js", "d3": "app/static/vendor/d3v5.min",
                "jquery": "app/static/vendor/jquery.min"}[m.group(1)]

    return {k: CDN.sub(local, v) for k, v in pages.items()}


def neuron_model_dir() -> Path:
    """The bundled BERT re-saved as pytorch_model.bin, the only format bertviz's forked classes load."""
    import torch
    from safetensors.torch import load_file

    from model_core.models.loading import bundled_model_path

    src = bundled_model_path()
    out = Path(tempfile.mkdtemp(prefix="bench_bertviz_"))
    torch.save(load_file(str(src / "model.safetensors")), out / "pytorch_model.bin")
    for name in ("config.json", "vocab.txt"):
        shutil.copy(src / name, out / name)
    return out


# -- serving and drawing ---------------------------------------------------------------------------
class Pages:
    """A local HTTP server: /NAME.html from memory, /app/static/... from the repo's static/."""

    def __init__(self) -> None:
        self.pages: dict[str, bytes] = {}
        pages = self.pages

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a, **kw):
                super().__init__(*a, directory=str(ROOT), **kw)

            def log_message(self, *a):  # quiet
                pass

            def do_GET(self):  # noqa: N802
                if self.path.lstrip("/") in pages:
                    body = pages[self.path.lstrip("/")]
                    if body is None:
                        self.send_error(404)
                        return
                    self.send_response(200)
                    self.send_header("Content-Type", "text/html; charset=utf-8")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                elif self.path.startswith("/app/static/"):
                    self.path = "/static/" + self.path[len("/app/static/"):]
                    super().do_GET()
                else:
                    self.send_error(404)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.origin = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


DRAWN_JS = """() => { const s = document.querySelector('svg'); return s !== null && s.querySelectorAll('*').length > 10; }"""
PAINT_JS = """() => new Promise(r => { void document.documentElement.offsetHeight;
    requestAnimationFrame(() => requestAnimationFrame(() => r(performance.now()))); })"""


def draw(browser, pages: Pages, name: str, html: str, timeout_s: float, screenshot: Path | None = None) -> dict:
    """Load one page; return its draw time (ms), SVG element count, outside requests, console errors."""
    pages.pages[name] = html.encode()
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    outside: list[str] = []
    errors: list[str] = []

    def route(r):
        if r.request.url.startswith(pages.origin):
            r.continue_()
        else:
            outside.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    result = {"ms": None, "elements": 0, "outside": outside, "errors": errors}
    try:
        page.goto(f"{pages.origin}/{name}", wait_until="commit", timeout=timeout_s * 1000)
        deadline = time.monotonic() + timeout_s
        while True:  # wait in slices, so that a page that failed does not use up the whole timeout
            try:
                page.wait_for_function(DRAWN_JS, polling="raf", timeout=2000)
                break
            except Exception:
                if errors or time.monotonic() > deadline:
                    raise
        result["ms"] = page.evaluate(PAINT_JS)
        result["elements"] = page.evaluate("document.querySelectorAll('svg *').length")
        result["content_height"] = page.evaluate(
            "Math.ceil(document.querySelector('[id^=bertviz-]').getBoundingClientRect().bottom)")
        if screenshot is not None:
            page.screenshot(path=str(screenshot), full_page=False)
    except Exception as exc:  # a timeout is a result here: the browser did not finish
        result["ms"] = None
        result["error"] = type(exc).__name__
    finally:
        context.close()
        pages.pages.pop(name, None)
    return result


def fmt_bytes(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def fmt_ms(r: dict, timeout_s: float) -> str:
    return f">{timeout_s:.0f} s" if r["ms"] is None else f"{r['ms'] / 1000:.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[13, 64, 128])
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for one view to draw")
    parser.add_argument("--screenshots", type=Path, default=Path("/tmp/bench_bertviz"))
    parser.add_argument("--no-raw", action="store_true", help="skip raw bertviz")
    args = parser.parse_args()

    missing = bv.vendor_missing(str(ROOT / "static"))
    if missing or not os.path.exists(CHROMIUM):
        sys.exit(f"needs {CHROMIUM} and static/vendor ({', '.join(missing) or 'present'}): run scripts/install_assets.sh")
    from model_core import TraceRequest, build_trace

    args.screenshots.mkdir(parents=True, exist_ok=True)
    model_dir = None if args.no_raw else neuron_model_dir()
    pages = Pages()
    rows = []
    with open_chromium() as browser:
        for n in args.sizes:
            text_a, text_b = pair_texts(n)
            trace = build_trace(TraceRequest("bert", text_a, text_b))
            assert trace.n_tokens == n, (trace.n_tokens, n)
            for kind in bv.VIEW_KINDS:
                t0 = time.perf_counter()
                if kind == "head":
                    view = bv.head_view_html(trace, layers=[0])
                elif kind == "model":
                    view = bv.model_view_html(trace)
                else:
                    view = bv.neuron_view_html(trace, layer=0, head=0)
                build_s = time.perf_counter() - t0
                ours = draw(browser, pages, f"ours-{kind}-{n}.html", view.html, args.timeout,
                            args.screenshots / f"ours-{kind}-{n}.png")
                row = {"n": n, "kind": kind, "bytes": len(view.html.encode()), "build_s": build_s, "ours": ours,
                       "height": view.height, "elements_est": view.n_elements}
                rows.append(row)
                print(f"  {kind} n={n}: ours {fmt_bytes(row['bytes'])}, {fmt_ms(ours, args.timeout)}, "
                      f"{ours['elements']} elements (estimate {view.n_elements}), content "
                      f"{ours.get('content_height')} px <= height {view.height}, outside {len(ours['outside'])}, "
                      f"errors {ours['errors'][:2]}", flush=True)
            if model_dir is not None:
                raw = raw_views(trace, model_dir, text_a, text_b)
                for row in rows[-3:]:
                    r = draw(browser, pages, f"raw-{row['kind']}-{n}.html", raw[row["kind"]], args.timeout,
                             args.screenshots / f"raw-{row['kind']}-{n}.png")
                    row["raw_bytes"] = len(raw[row["kind"]].encode())
                    row["raw"] = r
                    print(f"  {row['kind']} n={n}: raw {fmt_bytes(row['raw_bytes'])}, {fmt_ms(r, args.timeout)}, "
                          f"{r['elements']} elements, outside {len(r['outside'])}, errors {r['errors'][:2]}", flush=True)

    print()
    print("| view | tokens | ours: HTML | ours: draw | raw bertviz: HTML | raw bertviz: draw | bytes ratio | build (Python) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        raw = row.get("raw")
        raw_bytes = fmt_bytes(row["raw_bytes"]) if raw else "-"
        raw_ms = fmt_ms(raw, args.timeout) if raw else "-"
        ratio = f"1/{row['raw_bytes'] / row['bytes']:.0f}" if raw else "-"
        print(f"| {row['kind']} | {row['n']} | {fmt_bytes(row['bytes'])} | {fmt_ms(row['ours'], args.timeout)} | "
              f"{raw_bytes} | {raw_ms} | {ratio} | {row['build_s'] * 1000:.0f} ms |")
    print("\nours: head view = layer 0 (12 heads), model view = 6 layers x 12 heads, neuron view = layer 0; "
          "raw: all layers. Sentence pairs. Draw = navigation start to first painted frame with the SVG.")


if __name__ == "__main__":
    main()
