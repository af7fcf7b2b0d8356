"""A host-transfer budget: a circuit run (EAP and EAP-IG, with the faithfulness curve), a full trace and a patching run
copy from the model's device to the host a fixed, small number of times, however many pairs, heads, batches or
positions they hold.

On the CPU every tensor is on the host already, so the test counts the calls that would be a copy and a wait on a
GPU: ``Tensor.cpu``, ``.numpy``, ``.item``, ``.tolist``, ``float()``/``int()`` of a tensor, ``np.asarray`` of one
(``__array__``), and ``.to`` a CPU device, each counted only when the project's own code (model_core/,
attention_explorer/, ui/) calls it. A ``.to(device)`` written as "move only when elsewhere" never calls ``.to`` on the
CPU, and on a GPU it is a host-to-device copy, which this budget does not count.
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_models import build_tiny_decoder

OWN = tuple(f"{Path(__file__).resolve().parents[1] / part}/" for part in ("model_core", "attention_explorer", "ui"))
CIRCUIT_BUDGET = 100
"""The issue's bound for ``circuit`` with its curve."""
TRACE_BUDGET = 16
PATCHING_BUDGET = 30
COPIES = ("cpu", "numpy", "item", "tolist", "__float__", "__int__", "__array__")


def _is_cpu(target) -> bool:
    if isinstance(target, str):
        return torch.device(target).type == "cpu"
    if isinstance(target, torch.device):
        return target.type == "cpu"
    return isinstance(target, torch.Tensor) and target.device.type == "cpu"


def _to_cpu(args: tuple, kwargs: dict) -> bool:
    """Whether a ``Tensor.to`` call names a CPU device (a string, a device, or a tensor on the CPU)."""
    return any(_is_cpu(t) for t in (kwargs.get("device"), *args[:1]) if t is not None)


@contextlib.contextmanager
def counting() -> Iterator[collections.Counter]:
    """Count device-to-host copies by the project's own code: (method, file, function) -> calls."""
    counts: collections.Counter = collections.Counter()
    saved = {name: getattr(torch.Tensor, name) for name in (*COPIES, "to")}

    def counted(name, original, only=None):
        def wrapper(self, *args, **kwargs):
            caller = sys._getframe(1).f_code
            if caller.co_filename.startswith(OWN) and (only is None or only(args, kwargs)):
                counts[(name, Path(caller.co_filename).name, caller.co_name)] += 1
            return original(self, *args, **kwargs)
        return wrapper

    for name in COPIES:
        setattr(torch.Tensor, name, counted(name, saved[name]))
    torch.Tensor.to = counted("to", saved["to"], _to_cpu)
    try:
        yield counts
    finally:
        for name, original in saved.items():
            setattr(torch.Tensor, name, original)


def test_the_counter_counts_a_copy_in_project_code_only():
    """The counter sees ``.cpu()``, ``.item()`` and ``.to("cpu")`` from model_core, not from a test."""
    from model_core.trace.forward import to_numpy

    t = torch.ones(3)
    with counting() as counts:
        to_numpy(t)  # model_core: .to("cpu", float32) and .numpy()
        t.cpu(), t.sum().item(), t.to("cpu")  # this file: not counted
        t.to(torch.float64)  # no device: not a copy
    assert sum(counts.values()) == 2, counts


# -- circuits -------------------------------------------------------------------------------------------------------
# The tiny decoders' tokenizer makes these one token count, so n pairs are ceil(n / 16) batches of one shape.
PAIRS = [
    ("The cat sat on the mat and the", "The bank sat on the mat and the", " cat", " bank"),
    ("The banana sat on the mat and the", "The flies sat on the mat and the", " banana", " flies"),
    ("The bank sat on the mat and the", "The cat sat on the mat and the", " bank", " cat"),
]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from model_core.models.loading import load_pretrained_uncached

    folder = build_tiny_decoder("llama", tmp_path_factory.mktemp("transfers") / "llama")
    return load_pretrained_uncached(str(folder), device="cpu")


def _circuit_copies(loaded, n_pairs: int, method: str) -> tuple[int, collections.Counter]:
    from model_core.circuits.datasets import Dataset, Pair
    from model_core.circuits.eap import circuit_model
    from model_core.circuits.run import run_circuit

    cm = circuit_model(loaded.model, loaded.tokenizer)
    pairs = [Pair(*PAIRS[i % len(PAIRS)]) for i in range(n_pairs)]
    with counting() as counts:
        result = run_circuit(cm, Dataset.of(pairs), method=method, steps=2, batch_size=16, curve=True)
    assert result.n == n_pairs and result.curve is not None
    return sum(counts.values()), counts


@pytest.mark.parametrize("method", ["eap", "eap-ig"])
def test_a_circuit_run_copies_to_the_host_a_fixed_number_of_times(tiny_llama, method):
    """16 pairs are one batch, 32 pairs two; the curve runs 10 patched passes a batch. The copies stay the same
    number (before: 228 and 454 for EAP, 280 and 560 for EAP-IG, one in every hook), under the issue's 100."""
    few, few_counts = _circuit_copies(tiny_llama, 16, method)
    many, many_counts = _circuit_copies(tiny_llama, 32, method)
    assert few == many, (few_counts, many_counts)
    assert 0 < few <= CIRCUIT_BUDGET, few_counts


# -- a full trace ---------------------------------------------------------------------------------------------------
def _trace_copies(loaded, text: str) -> tuple[int, collections.Counter]:
    from model_core.trace.forward import trace_pretrained

    encoded = loaded.family.encode(loaded.tokenizer, text, max_tokens=128)
    with counting() as counts:
        trace = trace_pretrained(loaded, encoded)
    assert trace.next_token_ids is not None and trace.weights.shape[-1] == encoded.input_ids.shape[1]
    return sum(counts.values()), counts


def test_a_full_trace_copies_to_the_host_a_fixed_number_of_times(tiny_llama, monkeypatch):
    """A short and a longer text (the predictions unembedded 4 positions at a time, so the longer one takes many
    chunks) copy the same number of times: the arrays come over together at the end."""
    from model_core.trace import forward

    monkeypatch.setattr(forward, "PREDICTION_CHUNK", 4)
    short, short_counts = _trace_copies(tiny_llama, "The cat sat")
    long, long_counts = _trace_copies(tiny_llama, "The cat sat on the mat and watched the flies near the window. " * 3)
    assert short == long, (short_counts, long_counts)
    assert 0 < short <= TRACE_BUDGET, short_counts


# -- patching -------------------------------------------------------------------------------------------------------
def _patching_copies(loaded, batch: int) -> tuple[int, collections.Counter, np.ndarray]:
    from model_core.effects.patching import exact_patching, prepare_runs
    from model_core.effects.patching_inputs import check_inputs

    family, tok = loaded.family, loaded.tokenizer
    ids = [np.asarray(family.encode(tok, text, max_tokens=128).input_ids[0]) for text in
           ("The cat sat on the mat", "The bank sat on the mat")]
    inputs = check_inputs(tok, family, ids[0], ids[1], " cat", " bank")
    with counting() as counts:
        runs = prepare_runs(family, loaded.model, inputs)
        exact = exact_patching(family, loaded.model, runs, batch=batch)
    return sum(counts.values()), counts, np.concatenate([exact.heads.ravel(), exact.residual.ravel()])


def test_a_patching_run_copies_to_the_host_a_fixed_number_of_times(tiny_llama):
    """Every head and residual position patched 2 copies a pass (many passes) or all in one pass: the same
    number of copies, and the same effects."""
    small, small_counts, small_effects = _patching_copies(tiny_llama, 2)
    one, one_counts, one_effects = _patching_copies(tiny_llama, 64)
    np.testing.assert_allclose(small_effects, one_effects, atol=1e-5)
    assert small == one, (small_counts, one_counts)
    assert 0 < one <= PATCHING_BUDGET, one_counts


# -- generation -----------------------------------------------------------------------------------------------------
def _generation_copies(loaded, new_tokens: int) -> tuple[int, collections.Counter, list[int]]:
    from model_core.generate.generation import DecodingOptions, generate

    with counting() as counts:
        reply = generate(loaded, "The cat sat on the mat", options=DecodingOptions(max_new_tokens=new_tokens))
    assert reply.n_new == new_tokens  # the tiny model does not stop early on this prompt
    return sum(counts.values()), counts, [int(t) for t in reply.token_ids]


def test_greedy_generation_copies_once_a_token(tiny_llama):
    """A step's choice comes over with its top candidates in one copy (before: three, the candidates' ids, their
    probabilities and the chosen id apart); the tokens are those of an argmax of every step's logits."""
    few, few_counts, _ = _generation_copies(tiny_llama, 4)
    many, many_counts, ids = _generation_copies(tiny_llama, 12)
    assert many - few == 12 - 4, (few_counts, many_counts)
    with torch.inference_mode():  # the same tokens as a plain greedy loop over the whole sequence
        prompt = len(ids) - 12
        for at in range(prompt, len(ids)):
            logits = tiny_llama.model(torch.tensor([ids[:at]])).logits[0, -1]
            assert int(torch.argmax(logits)) == ids[at]


# -- head roles -----------------------------------------------------------------------------------------------------
def test_head_roles_copy_their_probe_batch_once_however_many_sequences(tiny_llama, tmp_path):
    """The probe sequences run as one batch; their weights and masks come over together (before: four copies a
    sequence), and the scores do not change."""
    from model_core.roles.probes import score_roles
    from model_core.trace.request import TraceRequest

    folder = str(build_tiny_decoder("llama", tmp_path / "llama"))
    request = TraceRequest("pretrained", "x", model_id=folder)
    seen = []
    for n in (2, 6):
        score_roles(request, n_sequences=n, seq_len=8)  # loaded and warm: the count is the run's alone
        with counting() as counts:
            scores = score_roles(request, n_sequences=n, seq_len=8)
        seen.append((sum(counts.values()), counts))
        assert np.isfinite(scores.scores["induction"]).all()
    assert seen[0][0] == seen[1][0] and 0 < seen[0][0] <= 10, seen


# -- the other passes, as the CLI runs them ---------------------------------------------------------------------------
SHORT_TEXT = "The cat sat on the mat."
LONG_TEXT = "The cat sat on the mat and watched the flies near the window. The dog slept by the door. " * 3
VERB_BUDGET = 40
"""A verb's copies with its JSON written: the arrays it keeps, once each."""
VERBS = {  # verb -> its arguments after the model's (the text goes in as {text}, the output folder as {out})
    "export": ["--text", "{text}", "--out", "{out}/trace.json"],
    "compact": ["--text", "{text}", "--compact", "--out", "{out}/trace.npz"],
    "qk": ["--text", "{text}", "--layer", "1", "--head", "0"],
    "attribute": ["--text", "{text}"],
    "kv": ["--text", "{text}", "--press", "snapkv", "--compression-ratio", "0.5"],
}


def _verb_copies(argv: list[str]) -> tuple[int, collections.Counter]:
    from model_core.cli.main import main

    with counting() as counts, contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(argv) == 0
    return sum(counts.values()), counts


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    return build_tiny_decoder("llama", tmp_path_factory.mktemp("verbs") / "llama")


@pytest.mark.parametrize("verb", VERBS)
def test_a_verbs_copies_do_not_grow_with_the_text(llama_folder, tmp_path, verb):
    """A trace (full and compact), a QK split, a logit attribution and a KV press: 7 tokens and 70 copy the same
    number of times, so nothing in the pass copies a position, head or layer at a time."""
    command = "export" if verb == "compact" else verb
    seen = []
    for i, text in enumerate((SHORT_TEXT, SHORT_TEXT, LONG_TEXT)):  # the first warms the model's cache
        out = tmp_path / str(i)
        out.mkdir()
        argv = [command, "--model", "pretrained", "--model-id", str(llama_folder),
                *(a.format(text=text, out=out) for a in VERBS[verb])]
        seen.append(_verb_copies(argv))
    assert seen[1][0] == seen[2][0], (seen[1][1], seen[2][1])
    assert 0 < seen[2][0] <= VERB_BUDGET, seen[2][1]


MEAN_PAIR = {"clean": "The cat sat on the mat and the", "corrupt": "The bank sat on the mat and the", "answer": " cat",
             "foil": " bank"}


def _unit_argv(verb: str, folder: Path, tmp_path: Path, n: int, at: int) -> list[str]:
    """``verb`` over n texts two a batch (corpus, atlas) or n pairs (mean patching)."""
    model = ["--model", "pretrained", "--model-id", str(folder)]
    if verb == "patch":
        data = tmp_path / f"pairs{n}.jsonl"
        data.write_text("".join(json.dumps(MEAN_PAIR) + "\n" for _ in range(n)), encoding="utf-8")
        return ["patch", *model, "--dataset", str(data), "--no-table", "--json"]
    corpus = tmp_path / f"corpus{n}.txt"
    corpus.write_text("".join(f"{SHORT_TEXT} Text number {i}.\n" for i in range(n)), encoding="utf-8")
    source = ["--input", str(corpus)] if verb == "corpus" else ["--corpus", str(corpus), "--qk-contexts", "2"]
    return [verb, *model, *source, "--out", str(tmp_path / f"{verb}{at}"), "--batch-size", "2"]


@pytest.mark.parametrize("verb", ["corpus", "atlas", "patch"])
def test_a_run_over_many_inputs_copies_a_fixed_number_of_times_a_unit(llama_folder, tmp_path, verb):
    """A corpus scan and an atlas write each batch's numbers as it ends, and mean patching keeps each pair's grids as
    it ends (so a stopped run keeps them): they copy a fixed number of times a batch or a pair, however many came
    before. Texts two a batch: 2, 4 and 6 texts; pairs: 1, 2 and 3."""
    per = 1 if verb == "patch" else 2
    counts = [_verb_copies(_unit_argv(verb, llama_folder, tmp_path, n * per, at))
              for at, n in enumerate((1, 1, 2, 3))]  # the first warms the model's cache
    one, two, three = (c[0] for c in counts[1:])
    assert two - one == three - two, [c[1] for c in counts[1:]]
    assert 0 < two - one <= 30, (counts[1][1], counts[2][1])
