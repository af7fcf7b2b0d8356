"""Edge attribution (EAP, EAP-IG) and faithfulness: EAP equals exact edge patching where the metric is linear in the
receiver's input, faithfulness is 1 with every edge and 0 with none, batches equal pairs run alone, a Stop keeps the
batches done, Ray equals the local engine, and bad input gets messages that name the pair."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from model_core.circuits.datasets import (
    Dataset,
    DatasetError,
    Pair,
    load_dataset,
    parse_pairs,
    validate,
)
from model_core.circuits.eap import (
    CircuitModelError,
    circuit_model,
    make_batches,
    score_batch,
)
from model_core.circuits.evaluate import circuit_metrics
from model_core.circuits.faithfulness import FRACTIONS
from model_core.circuits.run import run_circuit
from model_core.families import family_of
from model_core.models.loading import load_pretrained, load_pretrained_uncached

SMOL = "bundled:SmolLM2-135M-Instruct"

# The tiny decoders' tokenizer has " cat", " mat", " bank", " banana" and " flies" as single tokens.
TINY_PAIRS = [
    Pair("The cat sat on the mat and the", "The bank sat on the mat and the", " cat", " bank"),
    Pair("The banana sat on the mat and the", "The flies sat on the mat and the", " banana", " flies"),
    Pair("The bank sat on the mat and the", "The cat sat on the mat and the", " bank", " cat"),
    Pair("A cat and a bank", "A bank and a cat", " cat", " bank"),  # another token count
    Pair("A flies and a banana", "A banana and a flies", " flies", " banana"),
]


@pytest.fixture(scope="module")
def smol():
    loaded = load_pretrained(SMOL, device="cpu")
    return circuit_model(loaded.model, loaded.tokenizer)


def _tiny(tiny_decoders, family: str, double: bool = True):
    loaded = load_pretrained_uncached(str(tiny_decoders[family]), device="cpu")  # our own copy: we may change it
    model = loaded.model.double() if double else loaded.model
    return circuit_model(model, loaded.tokenizer)


def test_smollm2_has_123211_edges(smol):
    graph = smol.graph
    assert (graph.n_layers, graph.n_heads) == (30, 9)
    assert graph.n_edges == 123_211
    assert len([r for r in graph.receivers if r.endswith(">")]) == 30 * 9 * 3


def test_eap_equals_exact_edge_patching_where_the_metric_is_linear(tiny_decoders):
    """EAP (m = 1) is the first-order term of exact edge patching: Σ_pos Δ_u · ∂M/∂x_v on the clean run. It equals the
    exact effect when M is affine in x_v along Δ_u. Here v = ``logits`` (the final norm's input) and the final
    LayerNorm is made affine: with eps = 1e12 it computes (x − mean)/sqrt(var + 1e12), which is (x − mean)·1e-6 to a
    relative 1e-12·var (the tiny model's residual variance is far below 1), and its weight ×1e8 puts the logits on a scale
    where edge scores are about 0.1. M (the unembedding of that, at the last position)
    is then affine in x_v. Patching the one edge u → logits takes Δ_u out of x_v alone (the same receiver subtraction
    as faithfulness), so M_clean − M_patched must equal the EAP score. In float64. A head, an MLP and the input are
    checked for every sender (the largest score is far above the tolerance, so a wrong sign or a missing position
    fails; the input differs only at the changed name, not at the last position the metric reads, so its edge to
    ``logits`` scores 0 both ways)."""
    cm = _tiny(tiny_decoders, "gpt2")
    norm = family_of(cm.model).embed_parts(cm.model).final_norm  # test-only surgery on our own copy
    norm.eps = 1e12
    with torch.no_grad():
        norm.weight.mul_(1e8)
    pairs = validate(TINY_PAIRS[:3], cm.tokenizer).pairs
    assert len(pairs) == 3
    batch = make_batches(pairs, 8)[0]
    got = score_batch(cm, batch, steps=1)
    scores = got.score_sum / len(batch)
    graph = cm.graph
    logits = graph.logits_receiver
    circuits = []
    for s in range(len(graph.senders)):
        keep = graph.mask.copy()
        keep[s, logits] = False  # every edge but u -> logits
        circuits.append(keep)
    sums, clean, _, n = circuit_metrics(cm, [batch], circuits)
    assert clean / n == pytest.approx(got.clean.mean(), abs=1e-12)
    exact = clean / n - sums / n  # M_clean − M_patched, one sender at a time
    assert np.abs(scores[:, logits]).max() > 1e-2  # far above the tolerance: the comparison can fail
    np.testing.assert_allclose(scores[:, logits], exact, atol=1e-6, rtol=0)


def test_eap_is_first_order_on_an_unchanged_model(tiny_decoders):
    """On the tiny Llama (grouped-query attention) a small corruption's exact edge effect and its EAP score agree to
    first order: a head's <v> receiver in layer 1, whose input the pair changes only a little."""
    cm = _tiny(tiny_decoders, "llama")
    pairs = validate(TINY_PAIRS[:1], cm.tokenizer).pairs
    batch = make_batches(pairs)[0]
    got = score_batch(cm, batch, steps=1)
    graph = cm.graph
    r = graph.receiver_index("a1.h2<v>")
    s = graph.sender_index("input")
    keep = graph.mask.copy()
    keep[s, r] = False
    sums, clean, _, n = circuit_metrics(cm, [batch], [keep])
    exact = clean / n - sums[0] / n
    assert abs(exact) > 1e-4
    assert got.score_sum[s, r] == pytest.approx(exact, rel=0.5)  # first order only: the model is not linear


@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen2"])
def test_faithfulness_is_one_with_every_edge_and_zero_with_none_on_tiny_decoders(tiny_decoders, family):
    cm = _tiny(tiny_decoders, family, double=False)
    pairs = validate(TINY_PAIRS, cm.tokenizer).pairs
    batches = make_batches(pairs, 2)
    every, none = cm.graph.mask.copy(), np.zeros(cm.graph.shape, dtype=bool)
    sums, clean, corrupt, n = circuit_metrics(cm, batches, [every, none])
    assert n == len(pairs) == 5
    faith = (sums / n - corrupt / n) / (clean / n - corrupt / n)
    assert faith[0] == pytest.approx(1.0, abs=1e-5)
    assert faith[1] == pytest.approx(0.0, abs=1e-5)


def test_faithfulness_is_one_with_every_edge_and_zero_with_none_on_smollm2(smol):
    pairs = validate(load_dataset("ioi:3:0"), smol.tokenizer).pairs
    batches = make_batches(pairs)
    every, none = smol.graph.mask.copy(), np.zeros(smol.graph.shape, dtype=bool)
    sums, clean, corrupt, n = circuit_metrics(smol, batches, [every, none])
    assert n == 3 and clean / n - corrupt / n > 1.0  # the IOI pairs' corruption flips the answer
    faith = (sums / n - corrupt / n) / (clean / n - corrupt / n)
    assert faith[0] == pytest.approx(1.0, abs=1e-5)
    assert faith[1] == pytest.approx(0.0, abs=1e-5)


def test_a_batch_equals_its_pairs_run_alone(tiny_decoders):
    cm = _tiny(tiny_decoders, "llama")
    pairs = validate(TINY_PAIRS, cm.tokenizer).pairs
    together = run_circuit(cm, pairs_dataset(pairs), method="eap-ig", steps=3, batch_size=8, curve=False)
    assert len({b.clean.shape[1] for b in make_batches(pairs, 8)}) == 2  # two token counts, two batches, no padding
    alone = [score_batch(cm, b, 3) for b in make_batches(pairs, 1)]
    mean = sum(a.score_sum for a in alone) / len(alone)
    np.testing.assert_allclose(together.scores.matrix, mean, rtol=1e-9, atol=1e-12)
    assert together.clean == pytest.approx(np.mean([a.clean[0] for a in alone]), abs=1e-12)


def pairs_dataset(tokenized) -> Dataset:
    return Dataset.of([p.pair for p in tokenized])


def test_eap_ig_with_one_step_is_eap(tiny_decoders):
    cm = _tiny(tiny_decoders, "qwen2")
    batch = make_batches(validate(TINY_PAIRS[:3], cm.tokenizer).pairs)[0]
    np.testing.assert_array_equal(score_batch(cm, batch, 1).score_sum, score_batch(cm, batch, 1).score_sum)
    ig = score_batch(cm, batch, 4).score_sum
    eap = score_batch(cm, batch, 1).score_sum
    assert np.abs(ig - eap).max() > 1e-6  # the path's other points count
    run = run_circuit(cm, Dataset.of(TINY_PAIRS[:3]), method="eap", steps=7, curve=False)
    assert run.steps == 1 and run.method == "eap"
    np.testing.assert_allclose(run.scores.matrix, eap / 3, rtol=1e-12, atol=1e-15)


def test_a_stop_keeps_the_batches_done(tiny_decoders):
    cm = _tiny(tiny_decoders, "llama")
    asked = []

    def stop() -> bool:  # stop once the first batch is done
        asked.append(1)
        return len(asked) > 1
    kept = []
    result = run_circuit(cm, Dataset.of(TINY_PAIRS[:3]), steps=2, batch_size=2, stop=stop, keep=kept.append)
    assert result.partial and result.n == 2 and result.curve is None
    first = run_circuit(cm, Dataset.of(TINY_PAIRS[:2]), steps=2, batch_size=2, curve=False)
    np.testing.assert_allclose(result.scores.matrix, first.scores.matrix, rtol=1e-12, atol=1e-15)
    assert kept[-1] is result


def test_the_run_gives_the_curve_at_the_ten_fractions(tiny_decoders):
    cm = _tiny(tiny_decoders, "gpt2", double=False)
    seen = []
    result = run_circuit(cm, Dataset.of(TINY_PAIRS), steps=2, progress=lambda f, text: seen.append(f))
    assert result.n == 5 and not result.partial and result.problems == ()
    assert result.curve.fractions == FRACTIONS
    assert result.curve.values[-1] == pytest.approx(1.0, abs=1e-5)
    assert seen[0] == 0.0 and seen[-1] == 1.0 and seen == sorted(seen)
    payload = result.to_json()
    assert len(payload["edges"]) == cm.graph.n_edges and payload["method"] == "eap-ig" and payload["steps"] == 2


def test_bad_pairs_are_named_and_the_valid_ones_run(tiny_decoders):
    cm = _tiny(tiny_decoders, "gpt2", double=False)
    data = [*TINY_PAIRS[:2],
            Pair("The cat sat on the mat", "The cat sat on the mat and the", " cat", " bank"),  # token counts differ
            Pair("The cat sat on the mat and the", "The bank sat on the mat and the", " river", " bank")]  # 2 tokens
    result = run_circuit(cm, Dataset.of(data), steps=1, curve=False)
    assert result.n == 2
    assert len(result.problems) == 2
    assert result.problems[0].startswith("pair 3 (row 3)") and "corrupted prompt" in result.problems[0]
    assert result.problems[1].startswith("pair 4 (row 4)") and "' river' is 2 tokens" in result.problems[1]


def test_empty_and_unreadable_datasets_get_clear_messages(tiny_decoders):
    cm = _tiny(tiny_decoders, "gpt2", double=False)
    with pytest.raises(DatasetError, match="empty"):
        parse_pairs(b"", "pairs.jsonl")
    with pytest.raises(DatasetError, match="neither JSONL"):
        parse_pairs(b"just some words\nand more", "pairs.txt")
    with pytest.raises(DatasetError, match="holds no pairs"):
        run_circuit(cm, Dataset.of([]))
    only_bad = [Pair("The cat sat", "The cat sat on", " cat", " bank")]
    with pytest.raises(DatasetError, match="pair 1"):
        run_circuit(cm, Dataset.of(only_bad))
    with pytest.raises(ValueError, match="method"):
        run_circuit(cm, Dataset.of(TINY_PAIRS), method="acdc")


@pytest.mark.parametrize("family,why", [("gemma2", "normalises each sublayer"), ("phi", "share one normed input")])
def test_models_whose_writes_are_not_a_sum_are_refused(tiny_decoders, family, why):
    loaded = load_pretrained_uncached(str(tiny_decoders[family]), device="cpu")
    with pytest.raises(CircuitModelError, match=why):
        circuit_model(loaded.model, loaded.tokenizer)


@pytest.mark.slow
def test_ray_engine_equals_the_local_engine(tiny_decoders):
    ray = pytest.importorskip("ray")
    folder = str(tiny_decoders["llama"])
    loaded = load_pretrained(folder, device="cpu")
    cm = circuit_model(loaded.model, loaded.tokenizer)
    local = run_circuit(cm, Dataset.of(TINY_PAIRS), steps=2, batch_size=2, curve=False)
    try:
        remote = run_circuit(cm, Dataset.of(TINY_PAIRS), steps=2, batch_size=2, curve=False, engine="ray",
                             model_id=folder, num_cpus=2)
    finally:
        ray.shutdown()
    assert remote.n == local.n == 5
    np.testing.assert_allclose(remote.scores.matrix, local.scores.matrix, atol=1e-6, rtol=0)
    assert remote.clean == pytest.approx(local.clean, abs=1e-6)
    assert remote.corrupt == pytest.approx(local.corrupt, abs=1e-6)


def test_an_mlp_receivers_gradient_is_its_own_inputs(tiny_decoders):
    """g at ``m0`` is ∂M/∂(the MLP's own input) alone, not the residual stream's (which also reaches the logits past
    the MLP through the skip connection): it equals a central finite difference of a shift of the MLP's input."""
    from model_core.circuits.eap import as_rows, metric, receiver_gradients, sender_run
    from model_core.families.hooked import run_with_hooks

    cm = _tiny(tiny_decoders, "gpt2")
    batch = make_batches(validate(TINY_PAIRS[:1], cm.tokenizer).pairs)[0]
    clean = sender_run(cm, batch.clean, batch)
    grads = receiver_gradients(cm, batch, clean.embed, clean.embed, 1)
    torch.manual_seed(0)
    direction = torch.randn(*batch.clean.shape, cm.d_model, dtype=torch.float64)
    analytic = float(grads[cm.graph.mlp_receiver(0)] @ as_rows(direction)[0])

    def shifted(eps: float) -> float:
        hook = ("blocks.0.hook_mlp_in", lambda t, _p: t + eps * direction)
        return float(metric(run_with_hooks(cm.model, batch.clean, hooks=[hook]).logits, batch.answer, batch.foil))
    numeric = (shifted(1e-5) - shifted(-1e-5)) / 2e-5
    assert abs(analytic) > 1e-2
    assert analytic == pytest.approx(numeric, rel=1e-5)


def test_a_batch_holds_16_pairs_on_a_cpu_and_64_elsewhere(tiny_decoders):
    """A GPU's pass is mostly its kernel launches, so it takes 64 pairs a pass; a CPU's is its arithmetic (16). A
    model on the meta device stands in for one off the CPU; Ray's workers load theirs on the CPU. 20 pairs of one
    token count make batches of 16 and 4 by default on the CPU, as with ``batch_size=16``."""
    from model_core.circuits.eap import DEFAULT_BATCH, GPU_BATCH, default_batch

    cm = _tiny(tiny_decoders, "llama")
    elsewhere = torch.nn.Linear(2, 2, device="meta")
    assert (default_batch(cm.model), default_batch(elsewhere)) == (DEFAULT_BATCH, GPU_BATCH)
    assert default_batch(elsewhere, engine="ray") == DEFAULT_BATCH  # Ray's workers run on CPUs
    sizes = []
    twenty = Dataset.of([TINY_PAIRS[i % 3] for i in range(20)])
    run_circuit(cm, twenty, method="eap", curve=False, keep=lambda r: sizes.append(r.n))
    assert sizes[:2] == [16, 20]
