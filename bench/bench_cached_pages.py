"""Pages opened from a link for a text whose trace is already cached: Rollout, Norm-weighted and Head masking against
the heatmaps page (issue 32's targets: ≤ 1.5× the heatmaps page; masking ≤ 1.5× the heatmaps page plus one forward
pass).

Run: ``.venv/bin/python bench/bench_cached_pages.py`` (SmolLM2, 512 tokens, 3 rounds, about 3 minutes);
``--compare HEAD tree`` serves the last commit and the working tree side by side, their rounds alternating, for a
before and after under the same load; ``--profile FILE`` samples the last server with py-spy over the timed opens.

Each round takes a new text, warms its trace by opening the Home page (one heatmap: it builds the trace and nothing
the timed pages derive from it), then opens each timed page from a link in a fresh tab (one shared browser context,
so Streamlit's JavaScript comes from its cache) and times until every figure is drawn (``app_every_page``'s
``PAGE_READY_JS``). Every open is a page's first on that trace: its derived results (the heatmaps page's mosaic and
statistics, the rollout, the masked run) are computed in the time, the trace is not. The order of the pages turns
from round to round. Prints each open and, per page, the median ratio to the heatmaps page of the same round.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from app_common import MODEL_PARAMS, TIMEOUT_MS  # noqa: E402
from app_every_page import EVERY_PAGE, PAGE_READY_JS, forward_seconds, open_link  # noqa: E402
from app_profile import profile_summary  # noqa: E402
from harness import browser as browser_module  # noqa: E402
from harness.browser import ROOT, AppServer, open_chromium  # noqa: E402
from harness.texts import text_of  # noqa: E402

LABEL = "SmolLM2-135M decoder 30x9"
PAGES = ("heatmaps", "analysis_rollout", "analysis_norms", "analysis_masking")
IGNORED_NEEDED = ("static/vendor", "attention_explorer/views/vendor", ".venv")
"""Ignored paths a snapshot of the checkout links back to (vendored JavaScript, the virtual environment)."""


def snapshot(source: str, dest: Path) -> Path:
    """A copy of the checkout to serve: ``HEAD`` or any commit (``git archive``), or ``tree`` for the working tree as
    it is now (tracked and untracked files, not the ignored ones), so that edits made while the bench runs do not
    reach its server."""
    import shutil
    import subprocess

    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    if source == "tree":
        files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                               capture_output=True).stdout.decode().split("\0")
        for name in filter(None, files):
            if (ROOT / name).is_file():
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, dest / name)
    else:
        archive = subprocess.run(["git", "archive", source], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    for name in IGNORED_NEEDED:
        if (ROOT / name).exists() and not (dest / name).exists():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            (dest / name).symlink_to(ROOT / name)
    return dest


def server_at(root: Path, log: Path) -> AppServer:
    """``harness.browser.AppServer`` serving the checkout at ``root``."""
    saved = browser_module.ROOT
    browser_module.ROOT = root  # the launcher reads its ROOT when it starts the process
    try:
        return AppServer(log_path=log)
    finally:
        browser_module.ROOT = saved


def warm_trace(context, origin: str, params: dict, n_tokens: int) -> None:
    """Open the Home page on the text (its one heatmap needs the trace), so the trace is in the server's cache."""
    page = context.new_page()
    page.goto(f"{origin}/?{urllib.parse.urlencode(params)}", wait_until="commit")
    page.wait_for_function(PAGE_READY_JS, arg=[1, f"· {n_tokens} tokens"], polling=50, timeout=TIMEOUT_MS)
    page.close()


def one_round(context, server: AppServer, name: str, r: int, n_tokens: int) -> dict[str, float]:
    """Warm a new text's trace, then open each page once (the order turns with ``r``); seconds per page (NaN when
    a page did not draw)."""
    params = {**MODEL_PARAMS[LABEL], "text_b": "", "text_a": text_of(n_tokens, 701 + r, LABEL)}
    warm_trace(context, server.origin, params, n_tokens)
    times = {}
    for path in PAGES[r % len(PAGES):] + PAGES[:r % len(PAGES)]:
        try:
            page, _, seconds, size = open_link(context, server.origin, path, params, EVERY_PAGE[path][0], n_tokens)
            page.close()
        except Exception as exc:  # noqa: BLE001 - report it, keep measuring
            print(f"  {name} round {r + 1} {path}: did not draw ({type(exc).__name__}); see its server log", flush=True)
            seconds, size = float("nan"), 0
        times[path] = seconds
        print(f"  {name} round {r + 1} {path:18s} {seconds:5.2f} s  ({size / 1e6:.2f} MB)", flush=True)
    return times


def table(name: str, rounds: list[dict[str, float]], forward: float) -> str:
    lines = [f"\n{name}: SmolLM2, trace cached, {len(rounds)} rounds; forward pass {forward:.2f} s",
             "| page | open (median, range) | × heatmaps page (median, range over rounds) | target |",
             "|---|---:|---:|---|"]
    for path in PAGES:
        times = [r[path] for r in rounds]
        ratios = [r[path] / r["heatmaps"] for r in rounds]
        if path == "analysis_masking":
            limit = [r[path] / (1.5 * r["heatmaps"] + forward) for r in rounds]
            target = (f"≤ 1.5× heatmaps + forward: {statistics.median(limit):.2f} of that "
                      f"({min(limit):.2f}–{max(limit):.2f})")
        else:
            target = "≤ 1.5×" if path != "heatmaps" else "base"
        lines.append(f"| {path} | {statistics.median(times):.2f} s ({min(times):.2f}–{max(times):.2f}) | "
                     f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}) | {target} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compare", nargs="+", default=["tree"], metavar="SOURCE",
                        help="what to serve, each from a snapshot: 'tree' (the working tree now) or a commit such as "
                             "HEAD; with two, their rounds alternate in one run (before and after under the same load)")
    parser.add_argument("--profile", type=Path, default=None, help="py-spy samples of the last source's server")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bench_cached_pages"))
    args = parser.parse_args()
    forward_before = forward_seconds(LABEL, text_of(args.tokens, 700, LABEL))
    servers: dict[str, AppServer] = {}
    results: dict[str, list[dict[str, float]]] = {}
    try:
        for source in args.compare:
            root = snapshot(source, args.workdir / source.replace("/", "_"))
            servers[source] = server_at(root, args.workdir / f"{source.replace('/', '_')}.log")
            results[source] = []
        with open_chromium() as browser:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            for server in servers.values():
                warm_trace(context, server.origin, {**MODEL_PARAMS[LABEL], "text_b": "", "text_a": "warm up"}, 2)
            if args.profile is not None:
                list(servers.values())[-1].start_profile(args.profile)
            for r in range(args.rounds):
                for source, server in servers.items():
                    results[source].append(one_round(context, server, source, r, args.tokens))
            context.close()
    finally:
        for server in servers.values():
            server.stop()
    # The forward pass in this process (the server's thread count), before and after the rounds: the mean of the two.
    forward_after = forward_seconds(LABEL, text_of(args.tokens, 700, LABEL))
    forward = (forward_before + forward_after) / 2
    print(f"\nforward pass {forward_before:.2f} s before the rounds, {forward_after:.2f} s after")
    for source, rounds in results.items():
        print(table(source, rounds, forward))
    if args.profile is not None:
        print("\n" + profile_summary(args.profile, top=40))


if __name__ == "__main__":
    main()
