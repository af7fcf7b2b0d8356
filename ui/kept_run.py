"""A page's long run kept in the session as it goes, with a progress bar and a Stop button (the Circuits page, the
patching page's dataset mode).

A Stop (any click reruns the page, and Streamlit ends this run at its next progress message) keeps what the run has
finished, marked partial. The Stop button's callback runs only at the start of the next script run, so the run itself
is given no stop flag: the callback only marks the kept result as stopped by you.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import streamlit as st


@dataclass(frozen=True)
class KeptRun:
    """The session keys of one kind of run: ``result_key`` holds (run key, result) of the latest run, partial while it
    runs or when stopped; ``stopped_key`` is True when the Stop button (``button_key``) ended it."""

    result_key: str
    stopped_key: str
    button_key: str

    def finished(self, key: Any) -> Any | None:
        """This session's result for ``key`` (partial when stopped), or None."""
        kept = st.session_state.get(self.result_key)
        return kept[1] if kept is not None and kept[0] == key else None

    def keep(self, key: Any, result: Any) -> None:
        """Keep ``result`` (finished, or the part done so far) as this session's result for ``key``."""
        st.session_state[self.result_key] = (key, result)

    def _stop(self) -> None:
        st.session_state[self.stopped_key] = True

    @contextmanager
    def running(self, start: str, stop_help: str) -> Iterator[Any]:
        """A progress bar (yielded; its first text ``start``) and a Stop button (``stop_help`` says what it keeps)
        while the block runs; both are cleared when it ends."""
        st.session_state[self.stopped_key] = False
        bar = st.progress(0.0, text=start)
        stop_slot = st.empty()
        stop_slot.button("Stop", key=self.button_key, on_click=self._stop, icon=":material/stop:", help=stop_help)
        yield bar
        bar.empty()
        stop_slot.empty()
