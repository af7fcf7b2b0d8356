"""A/B of every page from a link: two trees' app servers timed in one run, page by page, back to back.

Run (the old tree a worktree of the commit to compare with, sharing this checkout's venv and vendor files)::

    git worktree add /tmp/old 79cebf0 && ln -s "$PWD/.venv" /tmp/old/.venv
    cp -r static/vendor /tmp/old/static/vendor    # and attention_explorer/views/vendor, where missing
    .venv/bin/python bench/bench_pages_ab.py --old /tmp/old --sizes 512 \\
        --models "custom 12x12x768" "SmolLM2-135M decoder 30x9" --repeat 3
    # the Effects pages (run button pressed, timed to the result; patching's own pair 128 tokens, ~85 s an open):
    .venv/bin/python bench/bench_pages_ab.py --old /tmp/old --sizes 512 --patch-tokens 128 \\
        --page contributions attribution patching --repeat 3
    # one page against the heatmaps page in each tree, and against "1.5 x heatmaps + one model pass" (--forward):
    .venv/bin/python bench/bench_pages_ab.py --old /tmp/old --sizes 512 --models "SmolLM2-135M decoder 30x9" \\
        --page heatmaps analysis_masking --forward --repeat 5

Each server runs its own tree's code (cwd and PYTHONPATH the tree; checked with ``py-spy dump`` while it warms up,
which names the files its frames run). Each page is opened from a link on both servers with the same new text (so
each open runs the forward pass), the order alternating per pair, so that the load of a shared machine falls on
both alike; the table gives the medians and the median of the per-pair ratios new/old. With the heatmaps page among
the pages, a second table gives each page's open over the heatmaps page's in the same tree and repeat; ``--forward``
adds one model pass (a warm trace of a text of the same size in this process, ``app_every_page.forward_seconds``,
measured once a repeat) and each page's open over ``1.5 x heatmaps + that pass``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from app_common import MODEL_PARAMS, TIMEOUT_MS
from app_every_page import (
    DECODER_FIGURES,
    EVERY_PAGE,
    NOT_FOR,
    PAGE_READY_JS,
    forward_seconds,
    open_link,
    use_picker,
    warm_up,
)
from app_profile import busy_samples

from harness.browser import AppServer, free_port, open_chromium, streamlit_command
from harness.texts import DECODERS, text_of

WARM_UP_TOKENS = 64  # each page drawn once on each server before the timed opens (the contexts page needs a repeat)


class Effects(NamedTuple):
    """An Effects page: the figures it draws from the link, the label its run button begins with (None: no button),
    the figures drawn once the run is done, and a text the finished page shows (None: the "· n tokens" caption)."""

    figures: int
    button: str | None = None
    figures_after: int = 0
    done_text: str | None = None


# The pages that run more than the trace (``--effects``, or named in ``--page``). Both trees label patching's button
# "Run exact patching (N patched passes)" (pages/patching.py at 79cebf0 and now); before it the page draws the
# attribution grid and the attention-beside-effect scatter, after it also the exact heads and residual grids.
EFFECTS_PAGES = {
    "contributions": Effects(1),  # the graph; the head maps only once a layer is picked
    "attribution": Effects(2),  # each head's effect and the parts
    "patching": Effects(2, "Run exact patching (", 4, "Rank correlation, attribution vs exact"),
}
EFFECTS_NOT_FOR = {"attribution": "encoder", "patching": "encoder"}  # an encoder's page only says it does not apply
PATCH_PAIR = ("When Mary and John went to the store, John gave a drink to",  # model_core.effects.pairs' first pair,
              "When Mary and John went to the store, Mary gave a drink to")  # the same in both trees
PATCH_PAIR_TOKENS = 14  # SmolLM2's pieces of either prompt


def not_for(path: str) -> str | None:
    return EFFECTS_NOT_FOR.get(path) if path in EFFECTS_PAGES else NOT_FOR.get(path)


def effects_params(label: str, n: int, variant: int, patch_tokens: int) -> dict:
    """The link's fields: the sidebar's text of ``n`` tokens; for patching also its own pair, of ``patch_tokens``
    tokens, a new prefix each time (exact patching is kept per pair for every session, so a repeated pair would
    not run)."""
    params = {**MODEL_PARAMS[label], "text_b": "", "text_a": text_of(n, variant, label)}
    if label in DECODERS:
        prefix = text_of(max(patch_tokens - PATCH_PAIR_TOKENS - 1, 2), variant, label) + "."  # "." one piece
        params.update(clean=f"{prefix} {PATCH_PAIR[0]}", corrupt=f"{prefix} {PATCH_PAIR[1]}")
    return params


def open_effects(context, origin: str, path: str, params: dict, n_tokens: int):
    """Open an Effects page from a link, press its run button if it has one, and wait until the result's figures
    are drawn (script finished, no stale element); (page, seconds from the link to the last figure)."""
    spec = EFFECTS_PAGES[path]
    page = context.new_page()
    start = time.perf_counter()
    page.goto(f"{origin}/{path}?{urllib.parse.urlencode(params)}", wait_until="commit")
    page.wait_for_function(PAGE_READY_JS, arg=[spec.figures, spec.button or f"· {n_tokens} tokens"], polling=50,
                           timeout=TIMEOUT_MS)
    if spec.button:
        page.get_by_role("button", name=re.compile("^" + re.escape(spec.button))).click()
        page.wait_for_function(PAGE_READY_JS, arg=[spec.figures_after, spec.done_text], polling=50,
                               timeout=TIMEOUT_MS * 3)
    seconds = time.perf_counter() - start
    return page, seconds


CODE_FILE = re.compile(r"(/[\w./-]+?)/(app\.py|pages/\w+\.py|ui/[\w/]+\.py|model_core/[\w/]+\.py|attention_explorer/[\w/]+\.py)")


class TreeServer(AppServer):
    """``AppServer`` on another tree: its app.py, run with its folder first on the import path."""

    def __init__(self, tree: Path, log_path: Path | None = None) -> None:
        self.tree = tree
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.profiler = None
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(tree)}
        with open(log_path or os.devnull, "w") as log:
            self.proc = subprocess.Popen(streamlit_command(self.port), cwd=tree, env=env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_healthy()


def code_roots(pid: int, stop: threading.Event, seen: set[str]) -> None:
    """Until ``stop``: the folders that the server's frames run the project's files from (``py-spy dump``)."""
    spy = str(ROOT / ".venv/bin/py-spy")
    while not stop.is_set():
        out = subprocess.run([spy, "dump", "--pid", str(pid), "--nonblocking", "--full-filenames"], capture_output=True, text=True,
                             check=False).stdout
        seen.update(m.group(1) for m in CODE_FILE.finditer(out))
        time.sleep(0.3)


def warm_and_check(context, server: TreeServer, models: list[str], pages: list[str], patch_tokens: int) -> set[str]:
    """Every page on a short text for each model (model loaded, page modules imported, JavaScript cached), while
    py-spy notes which tree's files the server runs; the set of those folders."""
    seen: set[str] = set()
    stop = threading.Event()
    spy = threading.Thread(target=code_roots, args=(server.proc.pid, stop, seen), daemon=True)
    spy.start()
    try:
        for label in models:
            for path in pages:
                if not_for(path) == ("decoder" if label in DECODERS else "encoder"):
                    continue
                if path in EFFECTS_PAGES:
                    params = effects_params(label, WARM_UP_TOKENS, 1, min(patch_tokens, WARM_UP_TOKENS))
                    open_effects(context, server.origin, path, params, WARM_UP_TOKENS)[0].close()
                else:
                    warm_up(context, server.origin, label, path, WARM_UP_TOKENS)
    finally:
        stop.set()
        spy.join()
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, required=True, help="the tree to compare with (its own app.py and code)")
    parser.add_argument("--new", type=Path, default=ROOT, help="the tree under test (this checkout unless told)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[512])
    parser.add_argument("--models", nargs="+", default=["custom 12x12x768", "SmolLM2-135M decoder 30x9"],
                        choices=list(MODEL_PARAMS))
    parser.add_argument("--page", nargs="+", metavar="PAGE", help="only these pages ('home' is the root page; "
                        "an Effects page named here is timed as --effects times it)")
    parser.add_argument("--effects", action="store_true",
                        help="also the Effects pages (" + ", ".join(EFFECTS_PAGES) + "), each opened from a link, its "
                             "run button pressed where it has one, timed until its result is drawn")
    parser.add_argument("--patch-tokens", type=int,
                        help="the patching page's own prompts, in tokens (the size unless told: exact patching runs "
                             "every head's patched pass on them)")
    parser.add_argument("--repeat", type=int, default=3, help="pairs per page, model and size (medians)")
    parser.add_argument("--changes", type=int, default=0, help="also time the page's own picker this many times")
    parser.add_argument("--forward", action="store_true",
                        help="after each repeat, time one model pass per model and size in this process (a warm "
                             "trace, median of 3) for the target 1.5 x heatmaps + one pass")
    parser.add_argument("--out", type=Path, help="write every timing here (JSON)")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="sample both servers with py-spy over the timed opens (DIR/old.txt, DIR/new.txt) and "
                             "print where each spent its busy samples, the functions that gained most first")
    args = parser.parse_args()
    pages = [p for p in EVERY_PAGE if not args.page or (p or "home") in args.page]
    pages += [p for p in EFFECTS_PAGES if (args.page and p in args.page) or (args.effects and not args.page)]
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; old {trees['old']}, new "
          f"{trees['new']}; {args.repeat} pairs a page", flush=True)
    servers: dict[str, TreeServer] = {}
    rows = []
    try:
        for name, tree in trees.items():
            servers[name] = TreeServer(tree)
        with open_chromium() as browser:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            for name, server in servers.items():
                seen = warm_and_check(context, server, args.models, pages, args.patch_tokens or min(args.sizes))
                print(f"  {name} server (pid {server.proc.pid}) runs the project's files from: {sorted(seen)}", flush=True)
                if not seen or any(Path(s).resolve() != trees[name] for s in seen):
                    sys.exit(f"the {name} server does not run {trees[name]}'s code only: {sorted(seen)}")
            if args.profile:
                args.profile.mkdir(parents=True, exist_ok=True)
                for name, server in servers.items():
                    server.start_profile(args.profile / f"{name}.txt")
            variants = itertools.count(701)
            for rep in range(args.repeat):
                flip = itertools.count(rep)  # each page's pairs alternate which server goes first
                for label in args.models:
                    for n in args.sizes:
                        for path in pages:
                            if not_for(path) == ("decoder" if label in DECODERS else "encoder"):
                                continue
                            variant = next(variants)
                            if path in EFFECTS_PAGES:
                                params = effects_params(label, n, variant, args.patch_tokens or n)
                            else:
                                min_figures, picker = EVERY_PAGE[path]
                                if label in DECODERS:
                                    min_figures = DECODER_FIGURES.get(path, min_figures)
                                params = {**MODEL_PARAMS[label], "text_b": "", "text_a": text_of(n, variant, label)}
                            order = ("old", "new") if next(flip) % 2 == 0 else ("new", "old")
                            pair = {}
                            for name in order:
                                change = []
                                if path in EFFECTS_PAGES:
                                    page, seconds = open_effects(context, servers[name].origin, path, params, n)
                                else:
                                    page, meter, seconds, _ = open_link(context, servers[name].origin, path, params,
                                                                        min_figures, n)
                                    change = [use_picker(page, meter, picker, min_figures, 2 + k % 2)[0]
                                              for k in range(args.changes)]
                                page.close()
                                pair[name] = seconds
                                rows.append({"tree": name, "model": label, "n": n, "page": path or "home", "rep": rep,
                                             "open_s": seconds, "change_s": change, "first": name == order[0]})
                            print(f"  rep {rep} {label} {n} {path or 'home':20s} old {pair['old']:6.2f} s  new "
                                  f"{pair['new']:6.2f} s  new/old {pair['new'] / pair['old']:.2f}  ({order[0]} first)",
                                  flush=True)
                if args.forward:  # the servers are idle meanwhile: the pass sees the machine the pages saw
                    for label in args.models:
                        for n in args.sizes:
                            seconds = forward_seconds(label, text_of(n, next(variants), label))
                            rows.append({"tree": "pass", "model": label, "n": n, "page": "(one model pass)",
                                         "rep": rep, "open_s": seconds, "change_s": [], "first": False})
                            print(f"  rep {rep} {label} {n} one model pass (a warm trace here) {seconds:6.2f} s",
                                  flush=True)
            context.close()
    finally:
        for server in servers.values():
            server.stop()
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    opens = [r for r in rows if r["tree"] != "pass"]
    print("\n" + ab_table(opens, args.changes))
    if any(r["page"] == "heatmaps" for r in opens) and len({r["page"] for r in opens}) > 1:
        print("\n" + heatmaps_table(rows))
    if "patching" in pages:
        print(f"(patching: the sidebar's text of the size above; its own clean/corrupted pair "
              f"{args.patch_tokens or 'the size'} tokens, exact patching run from its button)")
    if args.profile:
        print("\n" + profile_diff(args.profile / "old.txt", args.profile / "new.txt"))


def ab_table(rows: list[dict], changes: int) -> str:
    """Per page, model and size: each tree's median open, the ratio of the medians, the median per-pair ratio."""
    lines = ["| page | model | tokens | old median | new median | new/old (medians) | new/old (median of pairs) |"
             + (" picker old | picker new |" if changes else ""),
             "|---|---|---:|---:|---:|---:|---:|" + ("---:|---:|" if changes else "")]
    over = []
    keys = list(dict.fromkeys((r["page"], r["model"], r["n"]) for r in rows))
    for page, model, n in keys:
        mine = [r for r in rows if (r["page"], r["model"], r["n"]) == (page, model, n)]
        old = [r["open_s"] for r in mine if r["tree"] == "old"]
        new = [r["open_s"] for r in mine if r["tree"] == "new"]
        pairs = [b["open_s"] / a["open_s"] for a in mine if a["tree"] == "old"
                 for b in mine if b["tree"] == "new" and b["rep"] == a["rep"]]
        ratio, pair_ratio = statistics.median(new) / statistics.median(old), statistics.median(pairs)
        line = (f"| {page} | {model} | {n} | {statistics.median(old):.2f} s | {statistics.median(new):.2f} s | "
                f"{ratio:.2f} | {pair_ratio:.2f} |")
        if changes:
            co = [c for r in mine if r["tree"] == "old" for c in r["change_s"]]
            cn = [c for r in mine if r["tree"] == "new" for c in r["change_s"]]
            line += (f" {statistics.median(co):.2f} s | {statistics.median(cn):.2f} s |" if co and cn else
                     " – | – |")  # an Effects page has no picker timed
        lines.append(line)
        if ratio > 1.10 or pair_ratio > 1.10:
            over.append(f"{page} ({model}, {n})")
    lines.append("\nover 1.10: " + (", ".join(over) if over else "none"))
    return "\n".join(lines)


def heatmaps_table(rows: list[dict]) -> str:
    """Per tree, page, model and size: the page's open over the heatmaps page's in the same tree and repeat (each
    repeat's ratio, then their median); with the passes timed (``--forward``), the page's open over
    ``1.5 x heatmaps + one pass`` of that repeat (<= 1 meets that target)."""
    def open_of(tree: str, page: str, model: str, n: int, rep: int) -> float | None:
        found = [r["open_s"] for r in rows if (r["tree"], r["page"], r["model"], r["n"], r["rep"]) ==
                 (tree, page, model, n, rep)]
        return found[0] if found else None

    passes = {(r["model"], r["n"], r["rep"]): r["open_s"] for r in rows if r["tree"] == "pass"}
    lines = ["| tree | page | model | tokens | × heatmaps, each repeat | × heatmaps (median) |"
             + (" one pass (median) | target 1.5 × heatmaps + pass (median) | × target, each repeat | × target (median) |"
                if passes else ""),
             "|---|---|---|---:|---|---:|" + ("---:|---:|---|---:|" if passes else "")]
    keys = dict.fromkeys((r["tree"], r["page"], r["model"], r["n"]) for r in rows
                         if r["tree"] != "pass" and r["page"] != "heatmaps")
    for tree, page, model, n in keys:
        reps = sorted({r["rep"] for r in rows if (r["tree"], r["page"], r["model"], r["n"]) == (tree, page, model, n)})
        both = [(rep, open_of(tree, page, model, n, rep), open_of(tree, "heatmaps", model, n, rep)) for rep in reps]
        both = [(rep, m, h) for rep, m, h in both if m is not None and h is not None]
        if not both:
            continue
        ratios = [m / h for _, m, h in both]
        line = (f"| {tree} | {page} | {model} | {n} | " + ", ".join(f"{x:.2f}" for x in ratios)
                + f" | {statistics.median(ratios):.2f} |")
        if passes:
            timed = [(m, h, passes[(model, n, rep)]) for rep, m, h in both if (model, n, rep) in passes]
            if timed:
                targets = [1.5 * h + p for _, h, p in timed]
                over = [m / t for (m, _, _), t in zip(timed, targets)]
                line += (f" {statistics.median(p for _, _, p in timed):.2f} s | {statistics.median(targets):.2f} s | "
                         + ", ".join(f"{x:.2f}" for x in over) + f" | {statistics.median(over):.2f} |")
            else:
                line += " – | – | – | – |"
        lines.append(line)
    return "\n".join(lines)


def profile_diff(old_path: Path, new_path: Path, top: int = 30) -> str:
    """Each tree's busy samples over the same opens, per function (inclusive), the largest gains of new first."""
    old, old_total = busy_samples(old_path, full_paths=True)
    new, new_total = busy_samples(new_path, full_paths=True)
    names = sorted(set(old) | set(new), key=lambda k: new[k] - old[k], reverse=True)
    lines = [(f"busy samples at 50 Hz over the timed opens: old {old_total}, new {new_total} "
              f"({new_total / max(old_total, 1):.2f}x); inclusive, largest gain first:"),
             "| function | old | new | new - old |", "|---|---:|---:|---:|"]
    lines += [f"| {k} | {old[k]} | {new[k]} | {new[k] - old[k]:+d} |" for k in names[:top]]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
