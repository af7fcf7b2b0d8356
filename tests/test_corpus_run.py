"""Corpus runs: the run folder's formats, resume after an interruption, refusals, Ray against local, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.cli import run_cli
from model_core.analysis.per_head import STAT_NAMES
from model_core.corpus import (
    Corpus,
    CorpusModel,
    CorpusRunError,
    RunOptions,
    demo_corpus,
    open_run,
    run_corpus,
)

ROOT = Path(__file__).resolve().parents[1]
SMALL = CorpusModel.from_options("custom", num_hidden_layers=2, num_attention_heads=3, hidden_size=48, seed=1)
OPTIONS = RunOptions(batch_size=8, chunk_size=20)
# With the token sample (queries, keys, hidden states) and the nearest-context index.
SAMPLED = RunOptions(batch_size=8, chunk_size=20, sample_cap=200, keep_qk=True, index=True)


def _same_sample(a: Path, b: Path) -> None:
    from model_core.corpus.sample import read_array

    for kind in ("queries", "keys", "hidden"):
        np.testing.assert_allclose(read_array(a, kind).astype(np.float32), read_array(b, kind).astype(np.float32),
                                   atol=2e-3, rtol=2e-3)


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return demo_corpus(limit=70)  # 4 shards of 20, 20, 20, 10


def _arrays(run_dir: Path) -> dict[str, np.ndarray]:
    with np.load(run_dir / "head_stats.npz") as data:
        return {k: data[k] for k in data.files}


def test_run_folder_holds_npz_parquet_and_manifest(tmp_path, corpus):
    import pandas as pd

    run = run_corpus(corpus, SMALL, tmp_path / "run", options=OPTIONS, device="cpu")
    arrays = _arrays(run.path)
    for name in STAT_NAMES:
        assert arrays[f"{name}_mean"].shape == arrays[f"{name}_std"].shape == (2, 3)
    assert int(arrays["n_texts"]) == 70 and arrays["pattern_type"].shape == (2, 3)
    table = pd.read_parquet(run.path / "texts.parquet")  # a folder of parts, read whole by other tools
    assert sorted(table["text_id"]) == list(range(70))
    assert table["entropy"].iloc[0].shape == (6,)  # layer x head, layer-major
    manifest = json.loads((run.path / "manifest.json").read_text())
    assert manifest["complete"] and manifest["counts"]["done"] == 70
    assert manifest["corpus"]["fingerprint"] == corpus.fingerprint and manifest["model"] == SMALL.key()
    assert {"torch", "transformers", "numpy", "pyarrow"} <= set(manifest["versions"])
    assert manifest["timings"]["seconds"] > 0
    reopened = open_run(run.path)  # reopened without recomputing
    np.testing.assert_array_equal(reopened.mean, run.mean)


def test_resume_after_an_interruption_equals_an_uninterrupted_run(tmp_path, corpus):
    whole = run_corpus(corpus, SMALL, tmp_path / "whole", options=SAMPLED, device="cpu")

    def interrupt(progress) -> None:
        if progress.done > 45:  # in the middle of the third shard
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_corpus(corpus, SMALL, tmp_path / "cut", options=SAMPLED, device="cpu", progress=interrupt)
    partial = open_run(tmp_path / "cut")  # a valid partial run
    assert not partial.complete and partial.n_texts == 40
    assert int(_arrays(tmp_path / "cut")["n_texts"]) == 40
    assert not (tmp_path / "cut" / "index").exists()  # the index is built once the run is complete
    resumed = run_corpus(corpus, SMALL, tmp_path / "cut", options=SAMPLED, device="cpu", resume=True)
    assert resumed.complete and resumed.n_texts == 70
    _same_sample(resumed.path, whole.path)
    assert resumed.manifest["sample"]["index"]["layers"] == 3
    np.testing.assert_array_equal(resumed.mean, whole.mean)  # same parts, same order: bit for bit
    np.testing.assert_array_equal(resumed.std, whole.std)
    np.testing.assert_array_equal(resumed.patterns, whole.patterns)


def test_an_interruption_between_a_part_and_its_sums_leaves_a_run_that_counts_the_part(tmp_path, corpus, monkeypatch):
    # Ctrl+C can land after a shard's part is on disk and before the sums and manifest say so (the CLI's test
    # hit this): the partial run must count what is on disk, as a resume does.
    from model_core.corpus import store

    real = store.write_head_stats
    calls = []

    def once_interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the second shard's part is written; its sums are not
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "write_head_stats", once_interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_corpus(corpus, SMALL, tmp_path / "cut", options=OPTIONS, device="cpu")
    monkeypatch.setattr(store, "write_head_stats", real)
    partial = open_run(tmp_path / "cut")
    assert not partial.complete and partial.n_texts == 40 == int(_arrays(tmp_path / "cut")["n_texts"])
    first_two = run_corpus(Corpus(corpus.name, corpus.texts[:40]), SMALL, tmp_path / "forty", options=OPTIONS,
                           device="cpu")
    np.testing.assert_allclose(partial.mean, first_two.mean, rtol=1e-12, atol=0)


def test_a_folder_with_a_run_is_not_overwritten_and_resume_checks_model_and_texts(tmp_path, corpus):
    run_corpus(corpus, SMALL, tmp_path / "run", options=OPTIONS, device="cpu")
    with pytest.raises(CorpusRunError, match="--resume"):
        run_corpus(corpus, SMALL, tmp_path / "run", options=OPTIONS, device="cpu")
    other = CorpusModel.from_options("custom", num_hidden_layers=2, num_attention_heads=3, hidden_size=48, seed=2)
    with pytest.raises(CorpusRunError, match="seed 1.*not.*seed 2"):
        run_corpus(corpus, other, tmp_path / "run", options=OPTIONS, device="cpu", resume=True)
    with pytest.raises(CorpusRunError, match="other texts"):
        run_corpus(demo_corpus(limit=60), SMALL, tmp_path / "run", options=OPTIONS, device="cpu", resume=True)


def test_runs_of_another_version_or_tool_are_refused(tmp_path, corpus):
    run = run_corpus(corpus, SMALL, tmp_path / "run", options=OPTIONS, device="cpu")
    manifest = json.loads((run.path / "manifest.json").read_text())
    (run.path / "manifest.json").write_text(json.dumps({**manifest, "format_version": 0}))
    with pytest.raises(CorpusRunError, match="format 0.*Run the corpus again"):
        open_run(run.path)
    (run.path / "manifest.json").write_text(json.dumps({"name": "something else"}))
    with pytest.raises(CorpusRunError, match="not a corpus run"):
        open_run(run.path)
    with pytest.raises(CorpusRunError, match="no manifest.json"):
        open_run(tmp_path)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "a.txt").write_text("x")
    with pytest.raises(CorpusRunError, match="not empty"):
        run_corpus(corpus, SMALL, tmp_path / "junk", options=OPTIONS, device="cpu")


def test_long_texts_are_truncated_or_skipped_and_counted(tmp_path):
    texts = (("short one", None), (" ".join(["word"] * 40), None), ("another short", "pair"))
    options = RunOptions(batch_size=4, chunk_size=10, max_tokens=16)
    cut = run_corpus(Corpus("t", texts), SMALL, tmp_path / "cut", options=options, device="cpu")
    assert cut.manifest["counts"]["truncated"] == 1 and cut.manifest["counts"]["skipped"] == 0
    assert cut.texts()["n_tokens"].to_pylist() == [4, 16, 6]
    skip = run_corpus(Corpus("t", texts), SMALL, tmp_path / "skip",
                      options=RunOptions(batch_size=4, chunk_size=10, max_tokens=16, long="skip"), device="cpu")
    assert skip.manifest["counts"]["skipped"] == 1 and skip.n_texts == 3
    assert skip.count[0].max() == 2  # the skipped text is in no statistic
    ids, _ = skip.per_text("entropy", 0, 0)
    assert list(ids) == [0, 2]


def test_extremes_are_the_highest_and_lowest_texts(tmp_path, corpus):
    run = run_corpus(corpus, SMALL, tmp_path / "run", options=OPTIONS, device="cpu")
    ids, values = run.per_text("to_cls", 1, 2)
    top, bottom = run.extremes("to_cls", 1, 2, k=3)
    assert [r["value"] for r in top] == pytest.approx(sorted(values)[::-1][:3])
    assert [r["value"] for r in bottom] == pytest.approx(sorted(values)[:3])
    assert top[0]["text_a"] == corpus.texts[top[0]["text_id"]][0]
    with pytest.raises(ValueError, match="out of range"):
        run.per_text("to_cls", 5, 0)


@pytest.mark.slow
def test_ray_engine_equals_the_local_engine(tmp_path, corpus):
    ray = pytest.importorskip("ray")
    local = run_corpus(corpus, SMALL, tmp_path / "local", options=SAMPLED, device="cpu")
    try:
        remote = run_corpus(corpus, SMALL, tmp_path / "ray", options=SAMPLED, engine="ray", ray_num_cpus=2)
    finally:
        ray.shutdown()
    assert remote.complete and remote.manifest["engine"] == "ray"
    np.testing.assert_allclose(remote.mean, local.mean, atol=1e-6)
    np.testing.assert_allclose(remote.std, local.std, atol=1e-6)
    np.testing.assert_array_equal(remote.count, local.count)
    _same_sample(remote.path, local.path)  # the same sampled tokens, whichever engine ran them


def _cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "model_core", "corpus", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})


@pytest.mark.slow
def test_cli_runs_the_demo_corpus_with_the_bundled_bert(tmp_path):
    result = _cli("--input", "demo", "--model", "bert", "--limit", "40", "--out", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr
    assert "wrote" in result.stdout and "40 texts" in result.stdout
    assert "text/s" in result.stderr  # the progress bar's rate
    run = open_run(tmp_path / "run")
    assert run.shape == (6, 12) and run.complete


@pytest.mark.slow
def test_cli_says_what_is_wrong(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    # The input's problems in this process (harness.cli); Ray's, which starts a client, through a real one
    result = run_cli("corpus", "--input", str(empty), "--model", "bert", "--out", str(tmp_path / "run"))
    assert result.returncode == 1 and "empty" in result.stderr and "Traceback" not in result.stderr
    table = tmp_path / "t.csv"
    table.write_text("sentence,label\nhello there,1\n")
    result = run_cli("corpus", "--input", str(table), "--column", "text", "--model", "bert", "--out",
                     str(tmp_path / "run"))
    assert result.returncode == 1 and "no column 'text'" in result.stderr and "sentence, label" in result.stderr
    result = _cli("--input", "demo", "--model", "bert", "--engine", "ray", "--ray-address", "10.255.255.1:1",
                  "--limit", "5", "--out", str(tmp_path / "ray"))
    assert result.returncode == 1 and "Ray cluster" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_ctrl_c_on_the_cli_leaves_a_partial_run_that_resume_finishes(tmp_path):
    import signal

    from harness.waits import wait_until

    texts = tmp_path / "texts.txt"
    n = 400  # eight shards: the signal lands after the first, with about 10 s of the run still to go
    texts.write_text("\n".join(f"text number {i} talks about banks, rivers and money." for i in range(n)))
    out = tmp_path / "run"
    args = [sys.executable, "-m", "model_core", "corpus", "--input", str(texts), "--model", "bert",
            "--shard-size", "50", "--batch-size", "16", "--out", str(out)]

    def as_from_a_terminal() -> None:
        # A child inherits an ignored SIGINT, and Python then sets no handler for it: a shell without job control
        # starts a background job (`make test &`) with SIGINT and SIGQUIT ignored, and the CLI then ran through the
        # signal below to its end. Start it as a terminal would, with Ctrl+C at its default.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"}, preexec_fn=as_from_a_terminal)
    wait_until(lambda: list((out / "texts.parquet").glob("part-*.parquet")), 120, "the run's first shard")
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "--resume" in stderr and "Traceback" not in stderr
    partial = open_run(out)
    assert not partial.complete and 0 < partial.n_texts < n
    # the resume in this process (the interrupted run above was the real process)
    resumed = run_cli("corpus", "--input", str(texts), "--model", "bert", "--shard-size", "50", "--batch-size", "16",
                      "--resume", "--out", str(out), env={"HF_HUB_OFFLINE": "1"})
    assert resumed.returncode == 0, resumed.stderr
    assert open_run(out).complete and open_run(out).n_texts == n


def test_ray_engine_without_ray_says_how_to_install(monkeypatch):
    from model_core.corpus import ray_engine

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ValueError, match="pip install 'ray"):
        ray_engine._ray()


def test_a_ray_address_where_nothing_answers_is_refused_at_once():
    import socket

    from model_core.corpus.ray_engine import _check_reachable

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        _check_reachable(f"127.0.0.1:{port}")  # something answers: left to Ray
        _check_reachable(f"ray://127.0.0.1:{port}")
    _check_reachable("auto")  # not host:port: Ray finds it its own way
    with pytest.raises(ValueError, match=rf"Could not reach the Ray cluster at '127\.0\.0\.1:{port}'.*ray start --head"):
        _check_reachable(f"127.0.0.1:{port}")  # closed now: refused before Ray's client waits on it
