"""The focused layer and head: one value every page reads, set through one function pair, held to the trace's shape.

``get_focus`` reads it and ``set_focus`` moves it (a click on a grid, a button, a link opened from another page);
``request_focus`` moves it from a page's script once the picker is drawn (applied by the next run).
``clamp_focus`` holds it to the model's shape, with a toast when it moves; ``focus_picker`` draws the one Layer/Head
picker. The URL mirrors it as ``layer`` and ``head`` (``ui.fields.QUERY_PARAMS`` maps them to the pickers' keys).
"""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from ui.fields import FOCUS_HEAD_KEY as HEAD_KEY
from ui.fields import FOCUS_LAYER_KEY as LAYER_KEY
# The focus outside the pickers' widget state. A picker drawn by a fragment loses its widget state when the next
# full run is another page (Streamlit drops it before the run starts); this plain key survives, and the next
# run's picker starts from it.
KEPT_KEY = "_focused_head"
# A head a page chose after the picker was drawn in this run (Streamlit forbids setting a drawn widget's value): the
# next run's ``clamp_focus`` applies it before the picker is drawn (``request_focus``).
PENDING_KEY = "_focus_pending"
# Whether the user chose the focus (the picker, a link's layer/head, a click or button that calls ``set_focus``), or it
# is still the default (0, 0) or a head a page opened on by itself (``focus_chosen``).
CHOSEN_KEY = "_focus_chosen"


@dataclass(frozen=True)
class Focus:
    """The focused head: ``layer`` and ``head`` count from 0."""

    layer: int = 0
    head: int = 0

    def __post_init__(self) -> None:
        if self.layer < 0 or self.head < 0:
            raise ValueError(f"Layer and head count from 0; got layer {self.layer}, head {self.head}.")


def _restore() -> None:
    """Put the kept focus back into the pickers' keys where Streamlit dropped their widget state."""
    s = st.session_state
    kept = s.get(KEPT_KEY)
    if kept is not None:
        for key, value in zip((LAYER_KEY, HEAD_KEY), kept):
            if s.get(key) is None:
                s[key] = value


def get_focus() -> Focus:
    """The focused head, as the picker, a link or ``set_focus`` last set it (not yet held to a model's shape)."""
    _restore()
    s = st.session_state
    return Focus(int(s.get(LAYER_KEY) or 0), int(s.get(HEAD_KEY) or 0))


def set_focus(layer: int, head: int) -> None:
    """Focus another head (e.g. from a click on a grid); the picker shows it from the next run.

    Call it from a widget callback, or before the picker is drawn in this run (Streamlit forbids setting a drawn
    widget's value)."""
    focus = Focus(int(layer), int(head))
    st.session_state[LAYER_KEY], st.session_state[HEAD_KEY] = focus.layer, focus.head
    st.session_state[KEPT_KEY] = (focus.layer, focus.head)
    st.session_state[CHOSEN_KEY] = True


def request_focus(layer: int, head: int, *, chosen: bool = True) -> None:
    """Focus another head from a page's script, after the picker may have been drawn: the next run applies it
    before it draws the picker (``clamp_focus``). The caller then reruns (``st.rerun()``).

    ``chosen``: the user asked for it (a button's result); False for a head a page opens on by itself, which a
    later visit may replace (``focus_chosen``)."""
    focus = Focus(int(layer), int(head))
    st.session_state[PENDING_KEY] = (focus.layer, focus.head, bool(chosen))


def focus_chosen() -> bool:
    """Whether the user chose the focused head (the picker, a link's layer/head, a click that called ``set_focus``)
    rather than leaving the default."""
    return bool(st.session_state.get(CHOSEN_KEY, False))


def _mark_chosen() -> None:
    st.session_state[CHOSEN_KEY] = True


def _apply_pending() -> None:
    """A head ``request_focus`` asked for, into the pickers' keys (before they are drawn); and, on a session's first
    run, whether its link named a layer or head (a choice the user made by following it)."""
    s = st.session_state
    if CHOSEN_KEY not in s:
        s[CHOSEN_KEY] = "layer" in st.query_params or "head" in st.query_params
    pending = s.pop(PENDING_KEY, None)
    if pending is not None:
        layer, head, chosen = pending
        s[LAYER_KEY], s[HEAD_KEY], s[KEPT_KEY] = layer, head, (layer, head)
        s[CHOSEN_KEY] = chosen or s[CHOSEN_KEY]


def clamp_focus(n_layers: int, n_heads: int) -> Focus:
    """The focus held to a model of ``n_layers`` x ``n_heads`` (stored so), with a toast when it moves.

    Call it before the picker is drawn: a link may name layer 29 of a 2-layer model."""
    s = st.session_state
    _apply_pending()
    wanted = get_focus()
    focus = Focus(min(wanted.layer, n_layers - 1), min(wanted.head, n_heads - 1))
    for name, asked, shown, count in (("Layer", wanted.layer, focus.layer, n_layers),
                                      ("Head", wanted.head, focus.head, n_heads)):
        if asked != shown:
            st.toast(f"{name} {asked} does not exist in this model ({name.lower()}s 0-{count - 1}); "
                     f"showing {name.lower()} {shown}.", icon="⚠️")
    s[LAYER_KEY], s[HEAD_KEY] = focus.layer, focus.head
    return focus


def focus_picker(n_layers: int, n_heads: int) -> Focus:
    """The Layer and Head selectors, side by side in the current container; the focus they show."""
    clamp_focus(n_layers, n_heads)
    c1, c2 = st.columns(2)
    c1.selectbox("Layer", range(n_layers), key=LAYER_KEY, on_change=_mark_chosen)
    c2.selectbox("Head", range(n_heads), key=HEAD_KEY, on_change=_mark_chosen)
    focus = Focus(int(st.session_state[LAYER_KEY]), int(st.session_state[HEAD_KEY]))
    st.session_state[KEPT_KEY] = (focus.layer, focus.head)
    return focus
