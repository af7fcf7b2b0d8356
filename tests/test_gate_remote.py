"""The gate as remote users meet it: the real app (AE_MAX_RUNS=1, SmolLM2) and three users that speak Streamlit's
websocket protocol (``harness.protocol``, what ``bench/bench_users.py --remote`` times), no browser on this machine.

Each opens its link a moment after the one before, with a 400-token text of its own: all three are served their page
(its three figures and the sidebar's token count), in the order they came, the later ones after the queue's note (with about how long is left once the
turns so far say it).
"""

from __future__ import annotations

import re
import threading

import pytest

from harness.protocol import ProtocolUser, run_users
from harness.texts import text_of
from model_core.settings import BUNDLED_DECODER_ID

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # it times a queue: alone on the cores

MODEL = "SmolLM2-135M decoder 30x9"
N_FIGURES = 3  # the heatmaps page: overview, focused head, the per-head summary
QUEUE_NOTE = re.compile(r"Waiting for the model: (you are next in the queue|\d+ pass(es)? ahead of you in the queue)"
                        r"[^.]*\.( About \d+ s to go\.)?")


def _user(origin: str, n_tokens: int, variant: int) -> ProtocolUser:
    query = {"model": "pretrained", "model_id": BUNDLED_DECODER_ID, "text_b": "", "text_a": text_of(n_tokens, variant,
                                                                                                     MODEL)}
    return ProtocolUser(origin, "heatmaps", query)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from harness.browser import AppServer

    server = AppServer(tmp_path_factory.mktemp("gate_remote") / "server.log", extra_env={"AE_MAX_RUNS": "1"})
    try:
        warm = run_users([_user(server.origin, 12, 1)], timeout_s=300)[0]  # loads the model
        assert warm.wait_s is not None, (warm.error, server.log_tail())
        users = [_user(server.origin, 400, 10 + i) for i in range(3)]
        threads = []
        for user in users:  # each in its own event loop, once the one before is in line (running or queued)
            threads.append(threading.Thread(target=run_users, args=([user], 300)))
            threads[-1].start()
            assert user.wait_in_line(300), (user.error, user.texts[:5], server.log_tail())
        for thread in threads:
            thread.join()
        yield users
    finally:
        server.stop()


def test_every_remote_user_is_served_its_page(served):
    for user in served:
        assert user.error == "" and user.wait_s is not None, user.error
        assert user.figures == N_FIGURES
        assert any("· 400 tokens" in text for text in user.texts), user.texts[:5]


def test_remote_users_are_served_in_the_order_they_came(served):
    finished = [user.opened + user.wait_s for user in served]
    assert finished == sorted(finished), finished


def test_a_later_user_hears_its_place_in_the_queue_and_about_how_long_is_left(served):
    for user in served[1:]:
        notes = [text for text in user.texts if text.startswith("Waiting for the model")]
        assert notes, user.texts[:8]
        # The estimate is left out while the running pass has outlasted the last turns' median (the first 400-token
        # pass after the 12-token warm-up), never a figure that is wrong for as long as that pass runs.
        assert all(QUEUE_NOTE.fullmatch(note) for note in notes), notes
    last = [text for text in served[-1].texts if text.startswith("Waiting for the model")]
    # Once the first 400-token pass has ended, the last user waits behind one like it: the median now knows.
    assert any(re.search(r" About \d+ s to go\.$", note) for note in last), last
