"""Attention Explorer: page config, navigation, the shared sidebar, and the one trace all pages read."""

from __future__ import annotations

import re
from pathlib import Path

import streamlit as st

from ui import (
    starting,  # first: on the server's first run it says what the imports below load, and how long
)

_FIRST_RUN_NOTE = starting.first_run_note()
with starting.heavy_imports():  # a fresh server's sessions import in turn (ui/starting.py says why)
    from model_core import InputError, ModelLoadError
    from model_core.gate import set_stop_check
    from model_core.models.run_memory import after_out_of_memory, out_of_memory
    from model_core.settings import BUNDLED_MODEL_ID, load_settings
    from model_core.trace.resolve import model_id_of
    from ui.compact import trace_compact
    from ui.context import make_context, set_context
    from ui.downloads import format_picker
    from ui.focus import Focus, clamp_focus, focus_picker
    from ui.home import register_pages
    from ui.loaders import (
        collect_after_run,
        get_trace,
        get_trace_form,
        prepare_bundled_decoder,
    )
    from ui.run_traces import release_run
    from ui.st_private import drop_stale_widget_callbacks, stop_if_asked
    from ui.state import (
        choose_model,
        init_state,
        render_controls,
        request_from_state,
        sync_query_params,
    )

ROOT = Path(__file__).parent

# An emoji favicon is drawn as a data: URL; a :material/...: one is fetched from fonts.gstatic.com,
# a request outside the app that a public, offline deployment must not make.
st.set_page_config(page_title="Attention Explorer", page_icon="👁️", layout="wide")

# (file, title, icon, section, draws the head picker). Pages are thin: they read the context and draw. A page that
# draws the sidebar's layer/head picker itself does so in a fragment with the views that depend on the head, so a
# change of head reruns only that fragment (ui.state.head_fragment); app.py draws it for every other page.
PAGES = [
    ("pages/home.py", "Home", ":material/home:", "Attention", True),
    ("pages/heatmaps.py", "Attention heatmaps", ":material/grid_view:", "Attention", True),
    ("pages/why_this_key.py", "Why this key", ":material/key:", "Attention", False),
    ("pages/predictions.py", "What the model predicts", ":material/lightbulb:", "Attention", False),
    ("pages/causal.py", "Causal mask & masked scores", ":material/change_history:", "Attention", True),
    ("pages/inside.py", "Inside the model", ":material/account_tree:", "Attention", True),
    ("pages/bertviz.py", "bertviz views", ":material/hub:", "Attention", False),
    ("pages/analysis_contexts.py", "One word, two contexts", ":material/compare_arrows:", "Analyses", False),
    ("pages/analysis_rollout.py", "Rollout & flow", ":material/waves:", "Analyses", False),
    ("pages/analysis_norms.py", "Norm-weighted attention", ":material/straighten:", "Analyses", True),
    ("pages/analysis_head_stats.py", "Head statistics", ":material/bar_chart:", "Analyses", True),
    ("pages/analysis_masking.py", "Head masking", ":material/content_cut:", "Analyses", False),
    ("pages/head_roles.py", "Head roles", ":material/psychology:", "Analyses", True),
    ("pages/contributions.py", "Contributions", ":material/account_tree:", "Effects", False),
    ("pages/attribution.py", "Direct logit attribution", ":material/functions:", "Effects", False),
    ("pages/patching.py", "Activation patching", ":material/swap_horiz:", "Effects", False),
    ("pages/circuits.py", "Circuits", ":material/schema:", "Effects", False),
    ("pages/generate.py", "Generate", ":material/chat:", "Generation", False),
    ("pages/kv_cache.py", "KV cache", ":material/compress:", "Generation", False),
    ("pages/corpus.py", "Corpus statistics", ":material/library_books:", "Corpus", False),
    ("pages/corpus_space.py", "Query–key space & nearest contexts", ":material/scatter_plot:", "Corpus", True),
    ("pages/head_atlas.py", "Head atlas", ":material/auto_stories:", "Corpus", False),
]
register_pages(PAGES)  # the Home page's links read them: one list of pages


def _navigation() -> st.navigation:
    missing = [path for path, *_ in PAGES if not (ROOT / path).exists()]
    if missing:  # a deleted or renamed page must not vanish from the app in silence
        raise FileNotFoundError(f"app.py lists pages that do not exist: {', '.join(missing)}")
    sections: dict[str, list] = {}
    for path, title, icon, section, _ in PAGES:
        sections.setdefault(section, []).append(st.Page(path, title=title, icon=icon, default=path == "pages/home.py"))
    return st.navigation(sections, position="top")


def _draws_picker(page) -> bool:
    """Whether ``page`` (the navigation's current page) draws the layer/head picker itself (its PAGES entry)."""
    return next((draws for _, title, _, _, draws in PAGES if title == page.title), False)


# Characters with which Markdown could draw a link, an image, LaTeX or an icon out of a model id
# typed by a user. They become HTML character references, which Markdown shows as the character.
_MARKDOWN_ACTIVE = re.compile(r"[\\`*_\[\]<>$~|:@&]")
# Streamlit links bare URLs, www. names and e-mail addresses even when escaped; an invisible word
# joiner (U+2060) after ":", "www" and before "@" stops that and reads the same.
_AUTOLINK = re.compile(r"(&#58;)(?=//)|(?i:(www))(?=\.)|(?=&#64;)")


def _as_text(message: str) -> str:
    """Escape Markdown so an error quoting user input shows it as typed (st.error and st.info render Markdown)."""
    escaped = _MARKDOWN_ACTIVE.sub(lambda m: f"&#{ord(m.group())};", message)
    return _AUTOLINK.sub(lambda m: (m.group(1) or m.group(2) or "") + "\u2060", escaped)


def _use_bundled() -> None:
    choose_model(BUNDLED_MODEL_ID)


def main() -> None:
    drop_stale_widget_callbacks()  # what Streamlit dropped after the last run (see the end of this function)
    try:
        settings = load_settings()
    except ValueError as exc:
        st.error(f"The server's settings are wrong: {exc}")
        st.stop()
    problems = init_state(settings)
    nav = _navigation()
    for problem in problems:
        st.toast(problem, icon="⚠️")
    head_slot = render_controls(settings)
    request, trace, compact, error = None, None, None, None
    try:
        request = request_from_state(settings)
        if request.model == "pretrained":
            prepare_bundled_decoder(model_id_of(request, settings))  # converted once, with its status
        form = get_trace_form(request) if request.model == "pretrained" else None
        if form is not None and form.compact:
            compact = trace_compact(request, form)
            if compact is None:
                error = "Cancelled."
        else:  # on a miss the page shows the queue's note while the pass waits its turn, then a spinner
            trace = get_trace(request)
    except (InputError, ModelLoadError, ValueError) as exc:
        error = _as_text(str(exc))
    except Exception as exc:  # noqa: BLE001 - a failing model must leave the app running
        error = _as_text(f"The model failed on this input ({type(exc).__name__}: {exc}). Try another text or model.")
    starting.done(_FIRST_RUN_NOTE)
    focus = Focus()
    words = None
    shaped = trace if trace is not None else compact
    if shaped is not None:
        focus = clamp_focus(shaped.n_layers, shaped.n_heads)
        if not _draws_picker(nav):
            with head_slot:
                focus_picker(shaped.n_layers, shaped.n_heads)
    if trace is not None:
        words = trace.words() if st.session_state.get("ctl_words") else None
        st.sidebar.caption(f"{trace.description} · {trace.n_tokens} tokens · {trace.dtype}")  # the precision (AE_DTYPE)
        if trace.is_decoder:  # a decoder has no [SEP]: say how it read sentence B
            st.sidebar.caption(f"A {trace.family.label} reads a pair as {trace.family.pair_rule}.")
    elif compact is not None:
        st.sidebar.caption(f"{compact.description} · {compact.n_tokens:,} tokens · compact form · {compact.dtype}")
    else:
        head_slot.error(error)  # right under the text, where the pickers would be
        uses_other_model = request is not None and request.model_id != BUNDLED_MODEL_ID and (
            request.model == "pretrained" or request.weights == "pretrained")
        if isinstance(error, str) and uses_other_model:
            head_slot.button("Use the bundled model", on_click=_use_bundled, type="primary")
    format_picker()  # the camera button of every chart on every page: PNG or SVG
    # The context names the trace and holds it for this run only: release_run lets it go, so an idle session does
    # not keep it out of the cache's byte budget (ui.run_traces).
    set_context(make_context(request, settings, shaped, error, focus=focus, head_slot=head_slot, words=words))
    sync_query_params(settings)
    completed = False
    try:
        nav.run()
        completed = True
    except (RuntimeError, MemoryError) as exc:  # torch's OutOfMemoryError is a RuntimeError
        if not out_of_memory(exc):
            raise
        st.error(after_out_of_memory(exc), icon=":material/memory:")  # and the server goes on for everyone
    finally:
        release_run()  # the trace out of the page's globals, which its fragments and callbacks keep alive
        # Earlier runs' page globals are held by callbacks of widgets that are gone: let them go, and collect them
        # once a new trace has pushed an old one out.
        dropped = drop_stale_widget_callbacks(at_end=True) if completed else 0
        collect_after_run(force=dropped > 0)


set_stop_check(stop_if_asked)  # Streamlit's Stop, or a closed tab, ends a pass at its next layer (model_core.gate)
with starting.first_run():  # a fresh server's first visitors load in turn (ui/starting.py)
    main()
