"""Unit tests for attention_explorer/views/: what goes into bertviz, what comes out, and how big it is."""

from __future__ import annotations

import base64
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from model_core.trace.trace import AttentionTrace
from attention_explorer.views import size
from bertviz_decode import decode_params
from attention_explorer import views as bv

ROOT = Path(__file__).resolve().parents[1]


def synthetic_trace(n_a: int = 6, n_b: int = 0, n_layers: int = 3, n_heads: int = 4, d_head: int = 8,
                    seed: int = 0, causal: bool = False, tokens: list[str] | None = None) -> AttentionTrace:
    """A trace with random queries and keys and the softmax weights they imply."""
    rng = np.random.default_rng(seed)
    n = n_a + n_b
    if tokens is None:
        tokens = ["[CLS]"] + [f"a{i}" for i in range(n_a - 2)] + ["[SEP]"]
        if n_b:
            tokens += [f"b{i}" for i in range(n_b - 1)] + ["[SEP]"]
    q = rng.normal(size=(n_layers, n_heads, n, d_head)).astype(np.float32)
    k = rng.normal(size=(n_layers, n_heads, n, d_head)).astype(np.float32)
    mask = np.tril(np.ones((n, n), bool)) if causal else np.ones((n, n), bool)
    s = np.where(mask, q @ np.swapaxes(k, -1, -2) / np.sqrt(d_head), -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return AttentionTrace(
        tokens=tuple(tokens), token_ids=np.arange(n), token_type_ids=np.array([0] * n_a + [1] * n_b),
        sentence_b_start=n_a if n_b else None, weights=w.astype(np.float32), mask=mask, queries=q, keys=k,
        values=rng.normal(size=q.shape).astype(np.float32), value_norms=np.ones((n_layers, n_heads, n), np.float32),
        hidden_states=np.zeros((n_layers + 1, n, 16), np.float32), model_kind="custom", causal=causal,
        description="synthetic",
    )


def by_name(params: dict, name: str) -> dict:
    return next(e for e in params["attention"] if e["name"] == name)


# -- rounding ------------------------------------------------------------------------------------
def test_quantize_keeps_every_value_within_half_a_thousandth():
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.random(100_000), rng.normal(scale=5, size=10_000),
                        [0.0, 1.0, 0.0005, 0.0015, 0.9995, -0.0005]]).astype(np.float32)
    err = np.abs(bv.quantize(x) / bv.SCALE - x.astype(np.float64))
    assert err.max() <= 5e-4 + 1e-9


def test_head_view_weights_decode_within_5e_4_of_the_trace():
    trace = synthetic_trace(7, 5, seed=2)
    params = decode_params(bv.head_view_html(trace))
    sent = np.asarray(params["attention"][0]["attn"])
    assert sent.shape == trace.weights.shape
    assert np.abs(sent - trace.weights).max() <= 5e-4 + 1e-7


def test_neuron_view_queries_and_keys_decode_within_5e_4_of_the_trace():
    trace = synthetic_trace(6, 4, seed=3)
    params = decode_params(bv.neuron_view_html(trace, layer=2, head=1))
    full = params["attention"]["all"]
    assert np.abs(np.asarray(full["queries"][0]) - trace.queries[2]).max() <= 5e-4 + 1e-7
    assert np.abs(np.asarray(full["keys"][0]) - trace.keys[2]).max() <= 5e-4 + 1e-7
    assert np.abs(np.asarray(full["attn"][0]) - trace.weights[2]).max() <= 5e-4 + 1e-7


def test_neuron_view_dot_products_from_sent_vectors_match_the_trace_scores():
    # neuron_view.js computes q.k / sqrt(d_head) from the vectors it is sent.
    trace = synthetic_trace(5, 0, d_head=16, seed=4)
    full = decode_params(bv.neuron_view_html(trace, layer=1))["attention"]["all"]
    q, k = np.asarray(full["queries"][0][3]), np.asarray(full["keys"][0][3])
    scores = q @ k.T / np.sqrt(trace.d_head)
    np.testing.assert_allclose(scores, trace.head_scores(1, 3), atol=0.01)


# -- bertviz's input contract --------------------------------------------------------------------
def test_inputs_have_one_tensor_per_shown_layer_with_a_batch_of_one():
    trace = synthetic_trace(6, 4, n_layers=3, n_heads=4)
    args = bv.bertviz_inputs(trace, layers=[0, 2])
    assert len(args["attention"]) == trace.n_layers  # bertviz indexes the list by layer number
    for layer in range(3):
        assert tuple(args["attention"][layer].shape) == (1, 4, 10, 10)
    assert args["attention"][1].untyped_storage().nbytes() == 4  # not shown: a broadcast zero, not sent
    assert np.abs(args["attention"][2][0].numpy() / bv.SCALE - trace.weights[2]).max() <= 5e-4 + 1e-7
    assert args["include_layers"] == [0, 2]
    assert args["tokens"] == list(trace.tokens) and args["sentence_b_start"] == 6


def test_bertviz_accepts_the_inputs_and_names_the_four_pair_filters():
    from bertviz import head_view, model_view

    trace = synthetic_trace(6, 4)
    args = bv.bertviz_inputs(trace, layers=[1])
    common = dict(attention=args["attention"], tokens=args["tokens"], sentence_b_start=args["sentence_b_start"],
                  include_layers=args["include_layers"], html_action="return")
    html = head_view(**common).data + model_view(**common, include_heads=args["heads"]).data
    for name in ("Sentence A -> Sentence A", "Sentence A -> Sentence B",
                 "Sentence B -> Sentence A", "Sentence B -> Sentence B"):
        assert html.count(f">{name}</option>") == 2


def test_pair_blocks_are_the_slices_of_the_full_matrix():
    trace = synthetic_trace(6, 4, seed=5)
    params = decode_params(bv.head_view_html(trace, layers=[1]))
    full = trace.weights[[1]]
    a, b = slice(0, 6), slice(6, 10)
    for name, rows, cols in (("Sentence A -> Sentence A", a, a), ("Sentence A -> Sentence B", a, b),
                             ("Sentence B -> Sentence A", b, a), ("Sentence B -> Sentence B", b, b)):
        entry = by_name(params, name)
        assert np.abs(np.asarray(entry["attn"]) - full[:, :, rows, cols]).max() <= 5e-4 + 1e-7
        assert entry["left_text"] == list(trace.tokens[rows]) and entry["right_text"] == list(trace.tokens[cols])


def test_pair_data_is_sent_once():
    trace = synthetic_trace(6, 4, n_layers=2, n_heads=3)
    view = bv.head_view_html(trace)
    at = view.html.index("aeExpand(") + len("aeExpand(")
    sent, _ = json.JSONDecoder().raw_decode(view.html, at)  # what travels, before the browser expands it

    def numbers(x) -> int:
        if isinstance(x, dict) and "ae_b64" in x:  # packed uint16 weights: as many as its shape holds
            assert len(base64.b64decode(x["ae_b64"])) == 2 * math.prod(x["shape"])
            return math.prod(x["shape"])
        return sum(map(numbers, x)) if isinstance(x, list) else sum(map(numbers, x.values())) if isinstance(x, dict) else int(isinstance(x, int))

    # every weight once, plus four numbers per pair block
    assert numbers([e["attn"] for e in sent["attention"]]) == 2 * 3 * 10 * 10 + 4 * 4


def test_only_the_shown_layers_and_heads_are_sent():
    trace = synthetic_trace(5, 0, n_layers=4, n_heads=4)
    head = decode_params(bv.head_view_html(trace, layers=[2]))
    assert np.asarray(head["attention"][0]["attn"]).shape == (1, 4, 5, 5) and head["include_layers"] == [2]
    two_heads = decode_params(bv.head_view_html(trace, layers=[1], heads=[3, 1]))
    np.testing.assert_allclose(two_heads["attention"][0]["attn"][0], trace.weights[1, [3, 1]], atol=5e-4 + 1e-7)
    model = decode_params(bv.model_view_html(trace, layers=[1, 3], heads=[0, 2]))
    assert np.asarray(model["attention"][0]["attn"]).shape == (2, 2, 5, 5)
    np.testing.assert_allclose(model["attention"][0]["attn"][1][1], trace.weights[3, 2], atol=5e-4 + 1e-7)
    assert model["include_layers"] == [1, 3] and model["include_heads"] == [0, 2]
    neuron = decode_params(bv.neuron_view_html(trace, layer=3))
    assert np.asarray(neuron["attention"]["all"]["attn"]).shape == (1, 4, 5, 5)


def test_neuron_view_is_bidirectional_unless_the_trace_is_causal():
    causal = decode_params(bv.neuron_view_html(synthetic_trace(causal=True)))
    plain = decode_params(bv.neuron_view_html(synthetic_trace()))
    assert causal["bidirectional"] is False and plain["bidirectional"] is True


def test_neuron_view_pair_has_bertviz_filter_keys_and_shows_the_real_layer_number():
    view = bv.neuron_view_html(synthetic_trace(6, 4, n_layers=3), layer=2, head=3)
    params = decode_params(view)
    assert list(params["attention"]) == ["all", "aa", "bb", "ab", "ba"]
    assert params["head"] == 3 and params["default_filter"] == "all"
    assert np.asarray(params["attention"]["ab"]["queries"]).shape == (1, 4, 6, 8)
    assert np.asarray(params["attention"]["ab"]["keys"]).shape == (1, 4, 4, 8)
    assert "Layer: 2 " in view.html


# -- the page ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", bv.VIEW_KINDS)
def test_page_loads_only_the_local_assets(kind):
    view = bv.view_html(kind, synthetic_trace(6, 4), asset_base="app/static/vendor")
    assert not re.search(r"""["'](https?:)?//""", view.html)
    assert 'src="app/static/vendor/require.js"' in view.html
    d3 = "d3v3.min" if kind == "head" else "d3v5.min"
    assert f"'app/static/vendor/{d3}'" in view.html and "'app/static/vendor/jquery.min'" in view.html


def test_a_script_closing_token_cannot_end_the_script():
    tokens = ["[CLS]", "</script><script>alert(1)</script>", "x", "[SEP]"]
    view = bv.head_view_html(synthetic_trace(4, 0, tokens=tokens))
    assert view.html.count("</script>") == view.html.count("<script")
    assert decode_params(view)["attention"][0]["left_text"][1] == tokens[1]


@pytest.mark.parametrize("kind", bv.VIEW_KINDS)
def test_height_grows_with_the_tokens(kind):
    short = bv.view_html(kind, synthetic_trace(5, 0))
    long = bv.view_html(kind, synthetic_trace(20, 20))
    assert long.height > short.height > 100
    assert long.n_tokens == 40 and long.n_elements > short.n_elements


# -- token windows and size ----------------------------------------------------------------------
def test_token_window_slices_and_renumbers_the_pair():
    trace = synthetic_trace(6, 6, seed=6)
    args = bv.bertviz_inputs(trace, layers=[0], token_window=(4, 9))
    assert args["tokens"] == list(trace.tokens[4:9]) and args["sentence_b_start"] == 2
    np.testing.assert_allclose(args["attention"][0][0].numpy() / bv.SCALE, trace.weights[0, :, 4:9, 4:9], atol=5e-4 + 1e-7)


def test_a_window_inside_one_sentence_is_shown_as_one_sentence():
    trace = synthetic_trace(6, 6)
    assert bv.bertviz_inputs(trace, token_window=(0, 6))["sentence_b_start"] is None
    assert bv.bertviz_inputs(trace, token_window=(6, 12))["sentence_b_start"] is None
    assert "Sentence A" not in bv.head_view_html(trace, token_window=(7, 10)).html


@pytest.mark.parametrize("window", [(3, 3), (-1, 4), (0, 13), (5, 2)])
def test_bad_token_windows_say_the_valid_range(window):
    with pytest.raises(ValueError, match="12 tokens"):
        bv.head_view_html(synthetic_trace(6, 6), token_window=window)


def test_out_of_range_layers_and_heads_are_refused_with_the_range():
    trace = synthetic_trace(n_layers=3, n_heads=4)
    with pytest.raises(ValueError, match="layers 0-2"):
        bv.head_view_html(trace, layers=[3])
    with pytest.raises(ValueError, match="heads 0-3"):
        bv.model_view_html(trace, heads=[0, 4])
    with pytest.raises(ValueError, match="heads 0-3"):
        bv.neuron_view_html(trace, head=7)


def test_size_check_passes_a_short_input_and_refuses_a_long_model_view():
    short = size.check_size("model", synthetic_trace(6, 7, n_layers=6, n_heads=12))
    assert short.ok and short.message == ""
    long = size.check_size("model", synthetic_trace(64, 64, n_layers=6, n_heads=12, d_head=4))
    assert not long.ok
    assert "token window" in long.message and str(long.max_tokens) in long.message


def test_size_check_max_tokens_is_the_longest_input_within_the_limit():
    trace = synthetic_trace(100, 100, n_layers=2, n_heads=12, d_head=4)
    for kind in bv.VIEW_KINDS:
        check = size.check_size(kind, trace, limit=50_000)
        count = lambda n: size.count_elements(kind, n, 2, 12, 4)  # noqa: E731
        assert count(check.max_tokens) <= 50_000 < count(check.max_tokens + 1)
        assert size.check_size(kind, trace, token_window=(0, check.max_tokens), limit=50_000).ok
        assert not size.check_size(kind, trace, token_window=(0, check.max_tokens + 1), limit=50_000).ok


def test_the_first_window_of_a_view_the_sidebar_redraws_is_a_quick_one():
    """The head and neuron views redraw on a layer (or head) change: they start within DEFAULT_ELEMENTS, and the
    slider may widen them to max_tokens; the model view redraws on no sidebar change and starts at its most."""
    trace = synthetic_trace(300, 300, n_layers=2, n_heads=9, d_head=4)
    for kind in bv.VIEW_KINDS:
        check = size.check_size(kind, trace)
        count = lambda n: size.count_elements(kind, n, 2, 9, 4)  # noqa: E731
        quick = min(size.DEFAULT_ELEMENTS[kind], size.MAX_ELEMENTS)
        assert count(check.default_tokens) <= quick < count(check.default_tokens + 1)
        assert check.default_tokens <= check.max_tokens
    assert size.check_size("head", trace).default_tokens < size.check_size("head", trace).max_tokens
    assert size.check_size("model", trace).default_tokens == size.check_size("model", trace).max_tokens


def test_element_count_matches_what_the_browser_drew_for_the_head_view():
    # bench/bench_bertviz.py counted 2630 SVG elements for the 13-token head view of 12 heads.
    assert abs(size.count_elements("head", 13, 1, 12, 32) - 2630) / 2630 < 0.15


# -- layering and assets -------------------------------------------------------------------------
def test_importing_the_adapter_imports_neither_bertviz_nor_streamlit():
    code = ("import sys; import attention_explorer.views; "
            "print(sorted(m for m in ('bertviz', 'IPython', 'streamlit') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_install_script_copies_exactly_the_files_the_pages_load():
    script = (ROOT / "scripts" / "install_assets.sh").read_text()
    copied = re.findall(r'^\s+"[\w./-]+:([\w.-]+)"$', script, flags=re.M)
    assert sorted(copied) == sorted(bv.VENDOR_FILES)


def test_package_json_pins_d3_3_for_the_head_view_and_d3_5_for_the_others():
    deps = json.loads((ROOT / "package.json").read_text())["dependencies"]
    assert deps["d3v3"].startswith("npm:d3@3.") and deps["d3v5"].startswith("npm:d3@5.")
    lock = json.loads((ROOT / "package-lock.json").read_text())["packages"]
    assert lock["node_modules/d3v3"]["version"].startswith("3.") and lock["node_modules/d3v5"]["version"].startswith("5.")


# -- both real models ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_traces():
    from model_core import TraceRequest, build_trace

    return {
        "bert": build_trace(TraceRequest("bert", "time flies like an arrow", "fruit flies like a banana")),
        "custom": build_trace(TraceRequest("custom", "time flies like an arrow", "fruit flies like a banana", weights="random", num_hidden_layers=2, num_attention_heads=4, hidden_size=64, causal=True, seed=0)),
    }


@pytest.mark.slow
@pytest.mark.parametrize("model", ["bert", "custom"])
@pytest.mark.parametrize("kind", bv.VIEW_KINDS)
def test_every_view_of_both_models_carries_the_trace(real_traces, model, kind):
    trace = real_traces[model]
    view = bv.view_html(kind, trace, layers=[1], heads=[0])
    params = decode_params(view)
    full = params["attention"]["all"] if kind == "neuron" else params["attention"][0]
    assert full["left_text"] == list(trace.tokens)
    sent = np.asarray(full["attn"])
    expected = trace.weights[[1]] if kind == "neuron" else trace.weights[[1]][:, [0]]
    assert sent.shape == expected.shape and np.abs(sent - expected).max() <= 5e-4 + 1e-7


# -- the page, in Streamlit's AppTest -----------------------------------------------------------------
def _bertviz_page(**state):
    """app.py on the home page (sidebar, trace), then the bertviz page (see tests/test_pages_analysis.py)."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=180)
    for key, value in state.items():
        at.session_state[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    at.switch_page("pages/bertviz.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.mark.slow
@pytest.mark.skipif(bool(bv.vendor_missing(str(ROOT / "static"))), reason="static/vendor/ missing: run scripts/install_assets.sh")
@pytest.mark.parametrize("kind", bv.VIEW_KINDS)
def test_page_draws_each_view_of_a_short_pair_without_a_warning(kind):
    at = _bertviz_page(ctl_model="custom", ctl_num_hidden_layers=2, ctl_num_attention_heads=2, ctl_hidden_size=32, bv_kind=kind)
    assert [t.value for t in at.title] == ["bertviz views"]
    assert not at.error and not at.warning, [e.value for e in (*at.error, *at.warning)]
    assert len(at.get("iframe")) == 1


@pytest.mark.slow
@pytest.mark.skipif(bool(bv.vendor_missing(str(ROOT / "static"))), reason="static/vendor/ missing: run scripts/install_assets.sh")
def test_page_warns_and_windows_a_long_model_view():
    words = " ".join(["the quick brown fox jumps over the lazy dog"] * 8)
    at = _bertviz_page(ctl_text_a=words, ctl_text_b="", bv_kind="model")
    assert len(at.warning) == 1 and "token window" in at.warning[0].value
    assert at.slider(key="bv_window").value == (0, 37)
    assert len(at.get("iframe")) == 1
