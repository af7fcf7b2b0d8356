"""Direct logit attribution on tiny random decoders: the parts sum to the model's own logit, and every head's, MLP's
and the embedding's effect equals a reference computed here from plain forward hooks on the eager model (z at the
output projection's input, the attention and MLP outputs, the final norm's input), never from the trace."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_models import build_tiny_decoder

from model_core.effects.attribution import (
    NotADecoder,
    NotOneToken,
    attribute,
    head_sources,
    token_id_of,
    top_two,
)

TEXT = "time flies like an arrow and fruit flies like a banana"
# GPT-2, Llama (grouped-query), Qwen2 (q/k/v biases), Gemma (1 + w norms, scaled embeddings), Gemma 2 (a norm on
# the attention output, a final softcap), Gemma 3 and Phi (parallel blocks, biases everywhere, a LayerNorm).
FAMILIES = ("gpt2", "llama", "qwen2", "gemma", "gemma2", "gemma3_text", "phi")
ATOL = 1e-5


@cache
def _folder(family: str, root: str) -> Path:
    """A tiny decoder whose every bias (output projection, norms, unembedding) is random, so `rest` is tested."""
    from transformers import AutoModelForCausalLM

    folder = build_tiny_decoder(family, Path(root) / family)
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager")
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.1)
    model.save_pretrained(folder)
    return folder


@cache
def _traced(family: str, root: str):
    """(loaded model, its trace of TEXT) through the app's own route."""
    from model_core.models.loading import load_pretrained_uncached
    from model_core.trace.forward import trace_pretrained

    loaded = load_pretrained_uncached(str(_folder(family, root)), device="cpu")
    encoded = loaded.family.encode(loaded.tokenizer, TEXT, max_tokens=128)
    return loaded, trace_pretrained(loaded, encoded)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("dla"))


# -- the independent reference ---------------------------------------------------------------------------
def _frozen(norm: torch.nn.Module, x: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
    """The linear part of ``norm`` with its statistics taken at ``x``, applied to ``part`` (written out here)."""
    x, part = x.double(), part.double()
    w = norm.weight.double()
    if isinstance(norm, torch.nn.LayerNorm):
        return (part - part.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False) + norm.eps) * w
    eps = getattr(norm, "variance_epsilon", None) or norm.eps
    gain = 1.0 + w if type(norm).__name__.startswith("Gemma") else w
    return part / torch.sqrt((x * x).mean(-1) + eps) * gain


def _reference(folder: Path, answer: int, foil: int | None) -> dict:
    """Every component's direct effect at the last position from hooks on the eager transformers model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager").eval().double()
    model.requires_grad_(False)
    gpt2 = model.config.model_type == "gpt2"
    base = model.transformer if gpt2 else model.model
    blocks = list(base.h if gpt2 else base.layers)
    final = base.ln_f if gpt2 else getattr(base, "norm", None) or base.final_layernorm
    seen: dict = {}
    hooks = [final.register_forward_pre_hook(lambda m, a: seen.__setitem__("final", a[0][0, -1])),
             blocks[0].register_forward_pre_hook(lambda m, a, k: seen.__setitem__("embed", (a or (k["hidden_states"],))[0][0, -1]),
                                                 with_kwargs=True),
             model.get_output_embeddings().register_forward_hook(lambda m, a, o: seen.__setitem__("logits", o[0, -1]))]
    for i, block in enumerate(blocks):
        attn = block.attn if gpt2 else block.self_attn
        proj = attn.c_proj if gpt2 else getattr(attn, "o_proj", None) or attn.dense
        post = getattr(block, "post_attention_layernorm", None) if hasattr(block, "post_feedforward_layernorm") else None
        mlp_out = block.post_feedforward_layernorm if post is not None else block.mlp
        hooks += [proj.register_forward_pre_hook(lambda m, a, i=i: seen.__setitem__(("z", i), a[0][0, -1])),
                  proj.register_forward_hook(lambda m, a, o, i=i: seen.__setitem__(("attn", i), o[0, -1])),
                  mlp_out.register_forward_hook(lambda m, a, o, i=i: seen.__setitem__(("mlp", i), o[0, -1]))]
        seen[("modules", i)] = (proj, post)
    with torch.no_grad():
        model(tokenizer(TEXT, return_tensors="pt").input_ids)
    for hook in hooks:
        hook.remove()
    u = model.get_output_embeddings().weight[answer] - (0 if foil is None else model.get_output_embeddings().weight[foil])
    read = lambda part: float(_frozen(final, seen["final"], part) @ u)
    n_heads = model.config.num_attention_heads
    heads = np.zeros((len(blocks), n_heads))
    mlps = np.zeros(len(blocks))
    for i in range(len(blocks)):
        proj, post = seen[("modules", i)]
        w_o = proj.weight.T if gpt2 else proj.weight  # (d_model, head * d_head)
        z = seen[("z", i)].reshape(n_heads, -1)
        for h in range(n_heads):
            write = w_o[:, h * z.shape[1]:(h + 1) * z.shape[1]] @ z[h]
            heads[i, h] = read(write if post is None else _frozen(post, seen[("attn", i)], write))
        mlps[i] = read(seen[("mlp", i)])
    logits = seen["logits"]
    logit = float(logits[answer] - (0 if foil is None else logits[foil]))
    return {"heads": heads, "mlps": mlps, "embed": read(seen["embed"]), "logit": logit}


# -- the parts sum to the model's own logit, and equal the reference ------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_parts_sum_to_the_models_logit_and_equal_hooks(family, root):
    loaded, trace = _traced(family, root)
    answer, foil = top_two(trace)
    for foil_id in (None, foil):
        got = attribute(trace, loaded.model, loaded.family, answer, foil_id)
        ref = _reference(_folder(family, root), answer, foil_id)
        assert got.logit == pytest.approx(ref["logit"], abs=ATOL)  # the model's own logit, before any softcap
        assert got.total == pytest.approx(ref["logit"], abs=ATOL)
        np.testing.assert_allclose(got.heads, ref["heads"], atol=ATOL, rtol=0)
        np.testing.assert_allclose(got.mlps, ref["mlps"], atol=ATOL, rtol=0)
        assert got.embed == pytest.approx(ref["embed"], abs=ATOL)
        assert np.abs(got.heads).max() > 100 * ATOL  # the comparison above is not between zeros


def test_rest_holds_the_biases(root):
    """GPT-2's output-projection and final-LayerNorm biases reach the logit only through `rest`; a Llama has none."""
    loaded, trace = _traced("gpt2", root)
    assert abs(attribute(trace, loaded.model, loaded.family, *top_two(trace)).rest) > 1e-4
    loaded, trace = _traced("llama", root)
    assert attribute(trace, loaded.model, loaded.family, *top_two(trace)).rest == 0.0


def test_gemma2_logit_is_before_the_final_softcap(root):
    loaded, trace = _traced("gemma2", root)
    got = attribute(trace, loaded.model, loaded.family, top_two(trace)[0])
    cap = loaded.model.config.final_logit_softcapping
    assert got.final_softcap == cap and "softcap" in got.to_json()["note"]
    with torch.no_grad():
        out = loaded.model(torch.tensor(np.array(trace.token_ids))[None]).logits[0, -1, got.answer_id]
    assert float(out) == pytest.approx(cap * np.tanh(got.logit / cap), abs=ATOL)


def test_head_sources_sum_to_the_heads_effect(root):
    loaded, trace = _traced("llama", root)
    answer, foil = top_two(trace)
    got = attribute(trace, loaded.model, loaded.family, answer, foil)
    layer, head = np.unravel_index(np.abs(got.heads).argmax(), got.heads.shape)
    split = head_sources(trace, loaded.model, loaded.family, int(layer), int(head), answer, foil)
    assert split.shape == (trace.n_tokens,)
    assert split.sum() == pytest.approx(got.heads[layer, head], abs=ATOL)
    # Each term is the weight times the source's value read along the head's direction.
    j = int(np.abs(split).argmax())
    e = got.head_readout[layer, head]
    assert split[j] == pytest.approx(trace.weights[layer, head, -1, j] * float(trace.values[layer, head, j] @ e))


def test_an_earlier_position_is_attributed_too(root):
    loaded, trace = _traced("qwen2", root)
    answer = int(trace.next_token_ids[3, 0])
    got = attribute(trace, loaded.model, loaded.family, answer, position=3)
    assert got.position == 3 and got.total == pytest.approx(got.logit, abs=ATOL)
    assert got.logit != pytest.approx(attribute(trace, loaded.model, loaded.family, answer).logit)


def test_a_switched_off_head_has_no_effect(root):
    from model_core.trace.forward import trace_pretrained

    loaded, trace = _traced("llama", root)
    mask = np.ones((trace.n_layers, trace.n_heads), dtype=bool)
    mask[1, 2] = False
    off = trace_pretrained(loaded, loaded.family.encode(loaded.tokenizer, TEXT, max_tokens=128), head_mask=mask)
    got = attribute(off, loaded.model, loaded.family, *top_two(off))
    assert got.heads[1, 2] == 0.0 and got.total == pytest.approx(got.logit, abs=ATOL)


# -- answers, foils and bad input ---------------------------------------------------------------------------
def test_token_id_of_takes_the_token_as_written(root):
    loaded, _ = _traced("gpt2", root)
    tok = loaded.tokenizer
    banana = token_id_of(tok, " banana")
    assert tok.convert_ids_to_tokens(banana) == "Ġbanana"
    try:
        bare = token_id_of(tok, "banana")  # without its space it is another token, or several
    except NotOneToken:
        bare = None
    assert bare != banana


def test_several_pieces_are_listed(root):
    loaded, _ = _traced("gpt2", root)
    with pytest.raises(NotOneToken) as err:
        token_id_of(loaded.tokenizer, " xylophonequ")
    assert len(err.value.pieces) > 1 and "tokens" in str(err.value)
    assert "".join(err.value.pieces) == " xylophonequ"
    with pytest.raises(NotOneToken):
        token_id_of(loaded.tokenizer, "")


def test_bad_positions_ids_and_foils_say_what_to_do(root):
    loaded, trace = _traced("llama", root)
    answer = top_two(trace)[0]
    with pytest.raises(ValueError, match="outside this input"):
        attribute(trace, loaded.model, loaded.family, answer, position=trace.n_tokens)
    with pytest.raises(ValueError, match="vocabulary"):
        attribute(trace, loaded.model, loaded.family, 10**7)
    with pytest.raises(ValueError, match="foil is the answer"):
        attribute(trace, loaded.model, loaded.family, answer, answer)


def test_a_model_that_is_not_the_traces_is_refused(root):
    from model_core.models.loading import load_pretrained_uncached

    _, trace = _traced("llama", root)
    other = load_pretrained_uncached(str(_folder("llama", root)), device="cpu")  # a copy of its own to change
    with torch.no_grad():
        for p in other.model.lm_head.parameters():
            p.mul_(-1.0)  # its top prediction is now another token
    with pytest.raises(ValueError, match="the model the trace came from"):
        attribute(trace, other.model, other.family, top_two(trace)[0])


def test_an_encoder_is_refused():
    from model_core import TraceRequest, build_trace
    from model_core.families import family_named

    trace = build_trace(TraceRequest("custom", "time flies", num_hidden_layers=2, num_attention_heads=2,
                                     hidden_size=32), device="cpu")
    with pytest.raises(NotADecoder, match="needs a decoder"):
        attribute(trace, None, family_named(trace.model_kind), 0)


def test_json_has_the_command_lines_fields(root):
    loaded, trace = _traced("gpt2", root)
    got = attribute(trace, loaded.model, loaded.family, *top_two(trace)).to_json()
    assert {"tokens", "answer_id", "foil_id", "logit", "embed", "heads", "mlps", "rest"} <= set(got)
    assert np.shape(got["heads"]) == (trace.n_layers, trace.n_heads) and len(got["mlps"]) == trace.n_layers


# -- a long input: one more pass keeps the last position's z and residual stream ------------------------------
@pytest.mark.parametrize("family", ("gpt2", "llama", "gemma2", "phi"))
def test_the_extra_pass_of_a_long_input_gives_the_full_traces_numbers(family, root):
    from model_core.effects.attribution_long import attribute_last

    loaded, trace = _traced(family, root)
    answer, foil = top_two(trace)
    full = attribute(trace, loaded.model, loaded.family, answer, foil)
    last = attribute_last(loaded.family, loaded.model, trace.token_ids, trace.tokens, answer, foil,
                          int(trace.next_token_ids[-1, 0]))
    assert last.logit == pytest.approx(full.logit, abs=ATOL) and last.position == trace.n_tokens - 1
    np.testing.assert_allclose(last.heads, full.heads, atol=ATOL, rtol=0)
    np.testing.assert_allclose(last.mlps, full.mlps, atol=ATOL, rtol=0)
    np.testing.assert_allclose(last.head_readout, full.head_readout, atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", ("gpt2", "gemma2", "phi"))
def test_the_sum_check_catches_a_wrong_head_write(family, root, monkeypatch):
    """The MLPs are run on the residual stream the heads' writes give, so a wrong W_O (here layer 0's first two heads'
    slices swapped, a head-layout bug) leaves a gap the check reports; were each MLP's effect the layer's update minus
    the heads' write, it would absorb the error and the parts would still sum to the logit."""
    from model_core.effects import attribution as module

    loaded, trace = _traced(family, root)
    answer = top_two(trace)[0]
    assert attribute(trace, loaded.model, loaded.family, answer).mlps_run
    real = module.output_projections
    d_head = trace.values.shape[-1]

    def wrong(fam, model):
        out = real(fam, model)
        w, b = out[0]
        swapped = torch.cat([w[:, d_head:2 * d_head], w[:, :d_head], w[:, 2 * d_head:]], dim=1)
        return [(swapped, b), *out[1:]]

    monkeypatch.setattr(module, "output_projections", wrong)
    with pytest.raises(RuntimeError, match="does not add up"):
        attribute(trace, loaded.model, loaded.family, answer)


def test_the_command_line_defaults_to_the_runner_up_as_the_page_does(root, capsys):
    import json

    from model_core.cli.main import main

    _, trace = _traced("gpt2", root)
    top, second = top_two(trace)
    base = ["attribute", "--model", "pretrained", "--model-id", str(_folder("gpt2", root)), "--text", TEXT,
            "--device", "cpu", "--json"]
    for extra, foil in (([], second), (["--no-foil"], None), (["--foil", "runner-up"], second)):
        assert main(base + extra) == 0
        got = json.loads(capsys.readouterr().out)
        assert (got["answer_id"], got["foil_id"]) == (top, foil)
        assert got["mlps_run"] and got["parts_sum"] == pytest.approx(got["logit"], abs=ATOL)
    with pytest.raises(SystemExit) as exc:  # a foil and no foil: a usage error
        main(base + ["--foil", " flies", "--no-foil"])
    assert exc.value.code == 2
