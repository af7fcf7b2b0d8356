"""Every run knows its memory before it starts (model_core.models.run_memory): the estimates grow with the run's shapes,
a run over AE_RUN_MEMORY_MB is refused with the estimate and the limit, a circuit's long pairs run fewer to a batch
before they are refused, the page's cap on an upload, and the command line's --run-memory-mb."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import run_cli
from model_core.circuits.budget import batch_that_fits, first_pairs, fitted_batches, passes_a_batch, run_seconds
from model_core.circuits.datasets import Dataset, Pair, Problem, validate
from model_core.circuits.eap import circuit_model
from model_core.models.run_memory import (
    ModelShape,
    atlas_bytes,
    RunMemoryError,
    check_run_memory,
    circuit_batch_bytes,
    compact_trace_bytes,
    generation_bytes,
    longest_fitting,
    model_shape,
    patching_bytes,
    qk_bytes,
    trace_pass_bytes,
)
from model_core.settings import RUN_MEMORY_SHARE, load_settings, machine_memory_mb

ROOT = Path(__file__).resolve().parents[1]
SMOL = ModelShape(n_layers=30, n_heads=9, n_kv_heads=3, d_model=576, d_head=64, d_ff=1536, vocab=49152)
"""SmolLM2-135M's shape (its config: 30 layers, 9 heads of 64, 3 key/value heads, 576 wide, MLP 1536)."""
CALIBRATION = [  # (pairs a batch, tokens, measured peak MB above the model: edge scores, curve; 0: not measured),
    # SmolLM2 on the CPU, one batch in a fresh process (VmHWM reset after a warm-up): EAP, and EAP-IG (5 steps) last
    (1, 100, 810, 536), (1, 300, 2175, 1812), (1, 600, 4882, 0), (8, 40, 2418, 0), (16, 20, 2385, 1840),
    (16, 20, 2452, 0)]


# -- the estimates ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("estimate", [
    lambda t: circuit_batch_bytes(SMOL, 1, t), lambda t: circuit_batch_bytes(SMOL, 4, t, curve=False),
    lambda t: patching_bytes(SMOL, t), lambda t: patching_bytes(SMOL, t, attribution=False, copies=8),
    lambda t: trace_pass_bytes(SMOL, 2, t), lambda t: generation_bytes(SMOL, t, 64), lambda t: qk_bytes(SMOL, t, 200),
], ids=["circuit", "circuit-scores", "patching", "mean-patching", "trace", "generation", "qk"])
def test_every_estimate_grows_with_the_tokens(estimate):
    sizes = [estimate(t) for t in (1, 10, 100, 1000, 6000)]
    assert all(a < b for a, b in zip(sizes, sizes[1:])), sizes


def test_a_circuit_estimate_grows_with_the_pairs_a_batch():
    sizes = [circuit_batch_bytes(SMOL, b, 20) for b in (1, 2, 4, 8, 16, 32)]
    assert all(a < b for a, b in zip(sizes, sizes[1:])), sizes


@pytest.mark.parametrize("batch, tokens, scores_mb, curve_mb", CALIBRATION)
def test_the_circuit_estimate_is_above_the_measured_peak_and_within_half_again(batch, tokens, scores_mb, curve_mb):
    """Conservative, not absurd: the measured peaks (tests' docstring; the README's table) lie below the estimate,
    and the estimate is under 1.5 times the larger of them."""
    estimate = circuit_batch_bytes(SMOL, batch, tokens) / 1e6
    measured = max(scores_mb, curve_mb)
    assert measured <= estimate < 1.5 * measured, (estimate, measured)


def test_the_atlas_estimate_is_above_its_measured_peaks():
    """SmolLM2's atlas on 28 Nov, peak RSS above the loaded model (1 or 2 threads): 1,000 texts of up to 128 tokens
    (7 texts a scan batch, 1 a card batch) 785 MB, within half again; one text of about 4,000 tokens through the
    compact pass 296 MB (the estimate leans high there: every layer's queries and keys are counted whole)."""
    short = atlas_bytes(SMOL, 128, 7, 1, long_from=513, block=256) / 1e6
    assert 785 <= short < 1.5 * 785, short
    assert atlas_bytes(SMOL, 4096, 1, 1, long_from=513, block=256) / 1e6 >= 296
    # it never falls as the texts grow (from 513 tokens the cards of a 512-token text may stay the largest step)
    sizes = [atlas_bytes(SMOL, t, 1, 1, long_from=513, block=256) for t in (10, 100, 512, 513, 2048, 4096, 32768)]
    assert all(a <= b for a, b in zip(sizes, sizes[1:])) and sizes[0] < sizes[2] < sizes[-1], sizes


@pytest.mark.parametrize("tokens, measured_mb", [(1024, 133), (2048, 256), (4096, 594)])
def test_the_compact_trace_estimate_is_above_its_measured_peaks(tokens, measured_mb):
    """SmolLM2's compact trace as the app builds it (no predictions, no largest weight) on the CPU on 29 Nov, peak RSS
    above the loaded model in a fresh process after a warm-up; the estimate leans high at short lengths (its fixed
    150 MB), and stays under three times the measured from 2,048 tokens."""
    estimate = compact_trace_bytes(SMOL, tokens) / 1e6
    assert measured_mb <= estimate < (3.0 if tokens >= 2048 else 3.5) * measured_mb, (estimate, measured_mb)
    # on a GPU the host arrays are not the device's: the held queries and keys in the model's dtype and a block
    eight_b = ModelShape(32, 32, 8, 4096, 128, 14336, 128256, act_bytes=2)
    on_gpu = compact_trace_bytes(eight_b, 8192, on_device=True) / 1e6
    assert 2_700 < on_gpu < 6_000, on_gpu  # 2.7 GB of queries and keys, 0.8 GB of scores, 0.7 GB of MLP
    assert compact_trace_bytes(eight_b, 8192) / 1e6 > on_gpu  # the host's float32 copies: checked apart
    # Gemma 2's capped scores run eager attention: its T² scores, their cap and a float32 softmax count
    gemma2 = ModelShape(42, 16, 8, 3584, 256, 14336, 256000, act_bytes=2)
    capped = compact_trace_bytes(gemma2, 8192, on_device=True, softcap=True, masks=2)
    assert capped - compact_trace_bytes(gemma2, 8192, on_device=True, masks=2) >= 8 * 16 * 8192 ** 2, capped


def test_a_compact_trace_over_the_limit_is_refused_before_its_pass(tiny_decoders, monkeypatch):
    from model_core.compact.build import build_compact
    from model_core.trace.request import TraceRequest

    monkeypatch.setenv("AE_RUN_MEMORY_MB", "100")
    request = TraceRequest("pretrained", "the river and the valley " * 10, model_id=str(tiny_decoders["llama"]))
    with pytest.raises(RunMemoryError, match=r"A compact trace of [\d,]+ tokens would need about [\d,]+ MB.*"
                                             r"limit of 100 MB.*A shorter text fits"):
        build_compact(request, device="cpu")
    monkeypatch.setenv("AE_RUN_MEMORY_MB", "400")
    assert build_compact(request, device="cpu").n_tokens > 40


def test_on_a_gpu_a_compact_trace_checks_the_hosts_memory_too(tiny_decoders, monkeypatch):
    """The summary runs on the GPU, but the host keeps the trace's arrays: a limit the GPU's estimate fits and the
    host's does not refuses the trace, naming the host's limit."""
    import model_core.compact.build as build
    from gpu_sim import simulated_cuda

    limits = lambda settings=None, override_mb=None, device=None: 10_000.0 if device is not None else 100.0  # noqa
    monkeypatch.setattr(build, "run_memory_limit_mb", limits)
    request = build.TraceRequest("pretrained", "the river and the valley " * 10, model_id=str(tiny_decoders["llama"]))
    with simulated_cuda(), pytest.raises(RunMemoryError, match=r"limit of 100 MB for one run \(AE_RUN_MEMORY_MB\)"):
        build.build_compact(request, device="cuda")


def test_a_normal_ioi_run_fits_and_a_6000_token_pair_does_not_on_a_24_gb_machine():
    limit = 24_000 / RUN_MEMORY_SHARE
    assert batch_that_fits(SMOL, 20, 16, limit) == 16  # 16 IOI pairs of 20 tokens: one batch
    assert batch_that_fits(SMOL, 6000, 16, limit) == 0
    assert 0 < batch_that_fits(SMOL, 150, 16, limit) < 16  # long pairs run fewer to a batch before they are refused


def test_the_refusal_names_the_run_the_estimate_and_the_limit():
    with pytest.raises(RunMemoryError) as info:
        check_run_memory("Edge attribution of a pair", 12_345e6, 6_000, "Shorten it.")
    message = str(info.value)
    assert "Edge attribution of a pair" in message and "12,345 MB" in message and "6,000 MB" in message
    assert "AE_RUN_MEMORY_MB" in message and "--run-memory-mb" in message and "Shorten it." in message
    assert isinstance(info.value, ValueError)  # pages that catch ValueError show it
    check_run_memory("A small run", 5_999e6, 6_000, "")  # within the limit: nothing raised


def test_on_a_gpu_the_limit_is_at_most_nine_tenths_of_its_free_memory(monkeypatch):
    """A run's tensors live on the GPU, and AE_RUN_MEMORY_MB is a share of the host's memory: where the GPU has less
    free, its free memory is the limit and the refusal says so. No GPU here: ``mem_get_info`` answers as one with
    2 GB free would (the device need not exist to be named)."""
    import torch

    from model_core.models.run_memory import GpuLimit, device_of, run_memory_limit_mb
    from model_core.settings import Settings

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2_000e6, 16_000e6))
    cuda, settings = torch.device("cuda:0"), Settings(run_memory_mb=6_000)
    limit = run_memory_limit_mb(settings, device=cuda)
    assert isinstance(limit, GpuLimit) and limit == pytest.approx(1_800)
    assert run_memory_limit_mb(Settings(run_memory_mb=1_000), device=cuda) == 1_000  # the host's is smaller
    assert run_memory_limit_mb(settings, device=device_of(torch.nn.Linear(2, 2))) == 6_000  # a CPU: as before
    with pytest.raises(RunMemoryError) as info:
        check_run_memory("Edge attribution of a batch", 5_000e6, limit, "Take fewer pairs.")
    message = str(info.value)
    assert "5,000 MB" in message and "1,800 MB" in message and "2,000 MB free on cuda:0" in message
    assert "AE_RUN_MEMORY_MB" not in message.split("Take fewer pairs.")[0]  # the GPU, not the setting, set it
    check_run_memory("A small run", 1_700e6, limit, "")


def test_longest_fitting_is_the_last_size_within_the_limit():
    assert longest_fitting(lambda n: n * 1e6, 100) == 100
    assert longest_fitting(lambda n: 1e12, 100) == 0


# -- the setting ------------------------------------------------------------------------------------------------------
def test_the_limit_is_a_quarter_of_the_machine_by_default_and_reads_the_variable():
    assert load_settings({}).run_memory_mb == int(machine_memory_mb() / RUN_MEMORY_SHARE)
    assert load_settings({"AE_RUN_MEMORY_MB": "auto"}).run_memory_mb == load_settings({}).run_memory_mb
    assert load_settings({"AE_RUN_MEMORY_MB": "12000"}).run_memory_mb == 12_000
    assert load_settings({}).max_pairs == 256 and load_settings({"AE_MAX_PAIRS": "10"}).max_pairs == 10
    for name, bad in (("AE_RUN_MEMORY_MB", "lots"), ("AE_RUN_MEMORY_MB", "0"), ("AE_MAX_PAIRS", "0"),
                      ("AE_MAX_PAIRS", "many")):
        with pytest.raises(ValueError, match=name):
            load_settings({name: bad})


# -- circuits: batches that fit, or a refusal --------------------------------------------------------------------------
def _tiny_cm(tiny_decoders):
    from model_core.models.loading import load_pretrained

    loaded = load_pretrained(str(tiny_decoders["llama"]), device="cpu")
    return circuit_model(loaded.model, loaded.tokenizer)


def test_long_pairs_are_batched_smaller_and_a_pair_too_long_alone_is_refused(tiny_decoders):
    cm = _tiny_cm(tiny_decoders)
    shape = model_shape(cm.model)
    short = "The cat sat on the mat and the"
    pairs = [Pair(short, short.replace("cat", "bank"), " cat", " bank")] * 6
    checked = validate(pairs, cm.tokenizer)
    tokens = checked.pairs[0].n_tokens
    three = circuit_batch_bytes(shape, 3, tokens) / 1e6  # a limit that holds three pairs a batch, not four
    fitted = fitted_batches(cm, checked.pairs, 16, limit_mb=three)
    assert [len(b) for b in fitted.batches] == [3, 3] and fitted.sizes == {tokens: 3} and not fitted.problems
    assert [len(b) for b in fitted_batches(cm, checked.pairs, 16, limit_mb=1e6).batches] == [6]
    with pytest.raises(RunMemoryError, match=r"pair of \d+ tokens .* would need about [\d,]+ MB .* limit of 1 MB"):
        fitted_batches(cm, checked.pairs, 16, limit_mb=1)


def test_a_run_skips_the_pairs_too_long_and_names_them(tiny_decoders):
    from model_core.circuits.run import run_circuit

    cm = _tiny_cm(tiny_decoders)
    short = "The cat sat on the mat and the"
    long = " ".join([short] * 12)
    pairs = [Pair(short, short.replace("cat", "bank"), " cat", " bank"), Pair(long, long.replace("cat", "bank"), " cat",
                                                                              " bank")]
    checked = validate(pairs, cm.tokenizer)
    limit = circuit_batch_bytes(model_shape(cm.model), 1, checked.pairs[0].n_tokens) / 1e6 + 0.01
    result = run_circuit(cm, pairs, method="eap", curve=False, run_memory_mb=limit)
    assert result.n == 1
    assert len(result.problems) == 1 and result.problems[0].startswith("pair 2 (row 2)")
    assert "would need about" in result.problems[0] and "AE_RUN_MEMORY_MB" in result.problems[0]


def test_the_time_estimate_counts_every_batchs_tokens_and_passes(tiny_decoders):
    cm = _tiny_cm(tiny_decoders)
    short = "The cat sat on the mat and the"
    checked = validate([Pair(short, short.replace("cat", "bank"), " cat", " bank")] * 5, cm.tokenizer)
    batches = fitted_batches(cm, checked.pairs, 2, limit_mb=1e6).batches
    assert run_seconds(batches, 1.0, 1, True) == pytest.approx(2.5 * passes_a_batch(1, True))  # 5 pairs / 2 a pass
    assert passes_a_batch(5, True) > passes_a_batch(1, True) > passes_a_batch(1, False)


def test_an_upload_runs_its_first_pairs_only():
    pairs = tuple(Pair(f"a {i}", f"b {i}", " x", " y") for i in range(10))
    dataset = Dataset(pairs[:4] + pairs[5:], (1, 2, 3, 4, 6, 7, 8, 9, 10), (Problem(5, "bad json"),), "f.jsonl")
    capped, left_out = first_pairs(dataset, 6)
    assert capped.rows == (1, 2, 3, 4, 6) and [p.row for p in capped.problems] == [5] and left_out == 4
    assert first_pairs(dataset, 100) == (dataset, 0)


# -- the command line ---------------------------------------------------------------------------------------------------
def test_the_flag_sets_the_limit_of_one_command(tmp_path, tiny_decoders):
    # In this process (harness.cli puts the environment back after each call, as a process's end would)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"clean": "The cat sat on the mat and the", "corrupt": "The bank sat on the mat and the",
                                 "answer": " cat", "foil": " bank"}) + "\n")
    model = str(tiny_decoders["llama"])
    refused = run_cli("circuit", "--model", "pretrained", "--model-id", model, "--dataset", str(pairs), "--method",
                      "eap", "--no-curve", "--json", "--run-memory-mb", "100")
    assert refused.returncode == 1 and not refused.stdout
    assert re.search(r"error: Edge attribution of a pair of \d+ tokens .* would need about [\d,]+ MB of memory, over "
                     r"this server's limit of 100 MB", refused.stderr), refused.stderr
    ran = run_cli("circuit", "--model", "pretrained", "--model-id", model, "--dataset", str(pairs), "--method",
                  "eap", "--no-curve", "--json", "--run-memory-mb", "4000", env={"AE_RUN_MEMORY_MB": "100"})
    assert ran.returncode == 0 and json.loads(ran.stdout)["n"] == 1, ran.stderr  # the flag over the variable
    bad = run_cli("circuit", "--model", "pretrained", "--dataset", str(pairs), "--run-memory-mb", "-3")
    assert bad.returncode == 2 and "--run-memory-mb" in bad.stderr


@pytest.mark.slow
def test_a_6000_token_pair_on_the_command_line_is_refused_before_it_grows(tmp_path):
    """The issue's pair on SmolLM2, run as `python -m model_core circuit`: exit 1 with the estimate and the limit, and
    the command's peak memory (model and libraries included) stays below the limit."""
    clean = " ".join(["When Mary and John went to the store, John gave a drink to"] * 430)
    pair = {"clean": clean, "corrupt": clean.replace("Mary", "Anne"), "answer": " Mary", "foil": " John"}
    path = tmp_path / "long_pair.jsonl"
    path.write_text(json.dumps(pair) + "\n")
    # A wrapper reports its child's peak RSS (ru_maxrss of the children it waited for: only this command)
    wrapper = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
               "print('peak_kb', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
               "sys.exit(r.returncode)")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", wrapper, sys.executable, "-m", "model_core", "circuit", "--model",
                           "pretrained", "--model-id", "bundled:SmolLM2-135M-Instruct", "--dataset", str(path),
                           "--method", "eap", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 1 and not done.stdout, done.stderr
    limit = load_settings().run_memory_mb
    found = re.search(r"a pair of ([\d,]+) tokens .* would need about ([\d,]+) MB of memory, over this server's limit "
                      r"of ([\d,]+) MB", done.stderr)
    assert found, done.stderr
    tokens, estimate, said = (int(g.replace(",", "")) for g in found.groups())
    assert tokens > 5_000 and estimate > said == int(limit)
    peak_mb = int(re.search(r"peak_kb (\d+)", done.stderr).group(1)) / 1024
    print(f"\ncommand peak RSS {peak_mb:,.0f} MB (model included); estimate {estimate:,} MB; limit {limit:,.0f} MB")
    assert peak_mb < limit, (peak_mb, limit)


def test_a_page_shows_a_refusal_as_a_message(monkeypatch):
    """Head roles with AE_RUN_MEMORY_MB at 1 MB: the probe is refused before it runs, and the page says so."""
    from harness.apptest import open_page

    monkeypatch.setenv("AE_RUN_MEMORY_MB", "1")
    at = open_page("pages/head_roles.py", model="custom", state={
        "ctl_num_hidden_layers": 3, "ctl_num_attention_heads": 2, "ctl_hidden_size": 24})
    assert not at.exception, [e.value for e in at.exception]
    errors = [e.value for e in at.error]
    assert any("Head roles' probe" in e and "would need about" in e and "limit of 1 MB" in e for e in errors), errors
