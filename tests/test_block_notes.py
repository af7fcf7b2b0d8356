"""What the "Inside" page says about a decoder block comes from the family adapter (``Family.block_notes``, carried by
the decoder walk), not from a page asking a ``model_type``. Each tiny decoder's notes are checked against what its own
modules do (the norm's gain, the activation, the embedding's scale) and against what each architecture is known to
have (per-head q/k norms, norms around each sublayer); the page then says it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from streamlit.testing.v1 import AppTest

from model_core.models.loading import load_pretrained

ROOT = Path(__file__).resolve().parents[1]

# family -> (RMSNorm scales by 1 + w, per-head q/k norms, norms around each sublayer, activation, scaled lookup)
KNOWN = {
    "llama": (False, False, False, "SiLU", False),
    "qwen2": (False, False, False, "SiLU", False),
    "mistral": (False, False, False, "SiLU", False),
    "qwen3": (False, True, False, "SiLU", False),
    "gemma": (True, False, False, "GELU", True),
    "gemma2": (True, False, True, "GELU", True),
    "gemma3_text": (True, True, True, "GELU", True),
}


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_block_notes_say_what_each_architecture_has(tiny_decoders, name):
    loaded = load_pretrained(str(tiny_decoders[name]), device="cpu")
    notes = loaded.family.block_notes(loaded.model, 1)
    plus_one, qk_norm, sandwich, activation, scaled = KNOWN[name]
    assert (notes.norm_plus_one, notes.qk_norm, notes.sandwich, notes.activation) == (
        plus_one, qk_norm, sandwich, activation)
    hidden = loaded.model.config.hidden_size
    assert notes.lookup_scale == pytest.approx(math.sqrt(hidden) if scaled else 1.0, rel=1e-3)


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_block_notes_agree_with_the_modules_themselves(tiny_decoders, name):
    loaded = load_pretrained(str(tiny_decoders[name]), device="cpu")
    model, family = loaded.model, loaded.family
    notes, parts = family.block_notes(model, 1), family.parts(model, 1)
    torch.manual_seed(0)
    x = torch.randn(3, model.config.hidden_size)
    with torch.no_grad():
        # the norm: x / rms(x) times w, or times (1 + w)
        w = parts.ln1.weight.float()
        unit = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + notes.norm_eps)
        torch.testing.assert_close(parts.ln1(x), unit * (1 + w if notes.norm_plus_one else w), atol=1e-5, rtol=1e-4)
        # the activation, on the gated MLP's gate: SiLU or (tanh-approximated) GELU
        gate = torch.linspace(-4, 4, 101)
        act = parts.mlp.act_fn(gate)
        expected = (torch.nn.functional.silu(gate) if notes.activation == "SiLU"
                    else torch.nn.functional.gelu(gate, approximate="tanh"))
        torch.testing.assert_close(act, expected, atol=1e-3, rtol=1e-3)
        # the embedding module's output is the lookup times lookup_scale
        embed = family.embed_parts(model).embed
        ids = torch.tensor([[1, 2, 3]])
        torch.testing.assert_close(embed(ids)[0], embed.weight[ids[0]] * notes.lookup_scale, atol=1e-4, rtol=1e-4)
    assert (parts.q_norm is not None) == notes.qk_norm and (parts.attn_post_norm is not None) == notes.sandwich


def _page_text(at: AppTest) -> str:
    parts = [e.value for kind in ("markdown", "caption", "latex") for e in at.main.get(kind)]
    return "\n".join(str(p) for p in parts)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "said", "unsaid"), [
    ("gemma3_text", ("(1 + w)", "as Gemma 2 and 3 do", "GELU", "normalises each head's query and key",
                     "multiplies the lookup"), ("SiLU",)),
    ("qwen3", ("normalises each head's query and key", "SiLU"), ("(1 + w)", "as Gemma 2 and 3 do", "GELU",
                                                                 "multiplies the lookup")),
])
def test_the_inside_page_says_what_the_walk_carries(tiny_decoders, name, said, unsaid):
    from ui.inside_decoder import STEPS

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=180)
    for key, value in {"model": "pretrained", "model_id": str(tiny_decoders[name]),
                       "a": "time flies like an arrow"}.items():
        at.query_params[key] = value
    for step in range(1, len(STEPS) + 1):
        at.session_state[f"inside_step{step}"] = True
    at.run()
    at.switch_page("pages/inside.py")
    if "_app_context" in at.session_state:  # a stale context would skip the sidebar (tests/test_pages.py)
        del at.session_state["_app_context"]
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    text = _page_text(at)
    for phrase in said:
        assert phrase in text, phrase
    for phrase in unsaid:
        assert phrase not in text, phrase
