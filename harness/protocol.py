"""Users whose browsers are elsewhere: Streamlit's own websocket protocol, spoken without a browser.

A tab of ``bench_users`` draws its page on the server's own 2 cores, so its wait includes the browser's share of them
(Streamlit's JavaScript, Plotly): work a remote user's own machine does. A ``ProtocolUser`` sends what a browser
sends when a link is opened (a ``rerun_script`` message with the link's page and query string) and reads the server's
messages until the run of that page has finished; its wait is the server's alone. It checks the run delivered the
page: ``figures`` counts the Plotly charts it received and ``texts`` holds every markdown/caption body, so a caller can
look for the sidebar's ``· N tokens``.
"""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.parse
from dataclasses import dataclass, field

import websockets
from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

from ui.waiting import RUNNING  # the spinner while a page's pass runs

FINISHED_OK = ForwardMsg.ScriptFinishedStatus.Value("FINISHED_SUCCESSFULLY")
FOR_RERUN = ForwardMsg.ScriptFinishedStatus.Value("FINISHED_EARLY_FOR_RERUN")
QUEUE_PREFIX = "Waiting for the model"  # ui.waiting.queue_message: the note while a pass waits for its turn


@dataclass
class ProtocolUser:
    """One remote user: its link (``origin`` + ``path`` + ``query``) and what its first page run delivered."""

    origin: str
    path: str
    query: dict[str, str]
    opened: float = 0.0  # time.time() when its websocket was opened
    wait_s: float | None = None  # from opened to the message that ended its page's last run
    figures: int = 0
    texts: list[str] = field(default_factory=list)
    error: str = ""
    rss_mb: float | None = None  # the server's RSS when this user was served, where a caller notes it
    # Set once the page says this user's pass runs or waits in the queue: the user is in line at the gate.
    in_line: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)  # set when ``run`` returns, served or not

    def ws_url(self) -> str:
        return self.origin.replace("http", "ws", 1) + "/_stcore/stream"

    def rerun_message(self) -> bytes:
        """The ``rerun_script`` a browser sends for this link (page by name, the link's query string)."""
        msg = BackMsg()
        state = msg.rerun_script
        state.query_string = urllib.parse.urlencode(self.query)
        state.page_name = self.path.strip("/")
        state.context_info.url = f"{self.origin}/{self.path.strip('/')}?{state.query_string}"
        state.context_info.timezone = "UTC"
        state.context_info.locale = "en-US"
        return msg.SerializeToString()

    def _read(self, msg: ForwardMsg) -> bool:
        """Record one server message; True when it ends the page's run (a rerun that the app asked for goes on)."""
        if msg.HasField("delta") and msg.delta.HasField("new_element"):
            element = msg.delta.new_element
            kind = element.WhichOneof("type")
            if kind == "plotly_chart":
                self.figures += 1
            elif kind == "markdown":
                self.texts.append(element.markdown.body)
            elif kind == "alert":
                self.texts.append(element.alert.body)
            if self.texts and self.texts[-1].startswith(QUEUE_PREFIX):
                self.in_line.set()
        if msg.HasField("delta") and msg.delta.HasField("new_transient"):  # st.spinner's element is a transient one
            if any(e.WhichOneof("type") == "spinner" and e.spinner.text == RUNNING
                   for e in msg.delta.new_transient.elements):
                self.in_line.set()
        if msg.HasField("script_finished"):
            status = msg.script_finished
            if status == FOR_RERUN:
                self.figures, self.texts = 0, []  # the rerun draws the page again
                return False
            if status != FINISHED_OK:
                self.error = f"the run ended with {ForwardMsg.ScriptFinishedStatus.Name(status)}"
            return True
        return False

    async def run(self, timeout_s: float) -> None:
        """Open the websocket, ask for the page, and wait until its run has finished (or ``timeout_s`` passed)."""
        self.opened = time.time()
        try:
            async with websockets.connect(self.ws_url(), subprotocols=["streamlit"], max_size=None,
                                          origin=self.origin, open_timeout=timeout_s) as ws:
                await ws.send(self.rerun_message())
                async with asyncio.timeout(timeout_s):
                    while True:
                        raw = await ws.recv()
                        msg = ForwardMsg()
                        msg.ParseFromString(raw)
                        if self._read(msg):
                            self.wait_s = time.time() - self.opened
                            return
        except TimeoutError:
            self.error = f"not served after {timeout_s:.0f} s"
        except (OSError, websockets.WebSocketException) as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.done.set()

    def wait_in_line(self, timeout_s: float) -> bool:
        """Wait until this user is in line at the gate (True), or its run ended first or ``timeout_s`` passed."""
        deadline = time.monotonic() + timeout_s
        while not self.in_line.is_set() and not self.done.is_set() and time.monotonic() < deadline:
            self.in_line.wait(0.1)
        return self.in_line.is_set()


async def _run_all(users: list[ProtocolUser], timeout_s: float) -> None:
    await asyncio.gather(*(user.run(timeout_s) for user in users))


def run_users(users: list[ProtocolUser], timeout_s: float = 600) -> list[ProtocolUser]:
    """Open every user's link at once and wait for all of them; returns ``users``, filled in."""
    asyncio.run(_run_all(users, timeout_s))
    return users
