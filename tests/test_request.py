"""TraceRequest: one request type from the sidebar, the CLI and the tests to a trace; one model cache in the app."""

import numpy as np
import pytest

from model_core import CustomSpec, TraceRequest, build_trace
from model_core.corpus import CorpusModel
from model_core.settings import BUNDLED_MODEL_ID


def test_options_that_do_not_apply_are_normalised_so_equal_traces_have_equal_requests():
    assert TraceRequest("bert", "a", seed=5, causal=True, num_hidden_layers=2, weights="pretrained") == TraceRequest("bert", "a")
    assert hash(TraceRequest("bert", "a", causal=True)) == hash(TraceRequest("bert", "a"))
    # BERT weights bring their shape and post-LayerNorm; random weights take no model id.
    assert TraceRequest("custom", weights="pretrained", num_hidden_layers=3, norm_placement="pre").spec() == \
        TraceRequest("custom", weights="pretrained").spec()
    assert TraceRequest("custom", weights="pretrained").norm_placement == "post"
    assert TraceRequest("custom", model_id="some/bert", seed=2).model_id is None
    assert TraceRequest("custom", text_b=None).text_b == ""  # type: ignore[arg-type]
    assert TraceRequest("bert", model_id="  ").model_id is None


def test_a_head_mask_with_every_head_on_is_no_mask():
    assert TraceRequest("bert", head_mask=np.ones((6, 12), dtype=bool)).head_mask is None
    mask = np.ones((2, 3), dtype=bool)
    mask[1, 2] = False
    request = TraceRequest("bert", head_mask=mask)
    assert request.head_mask == ((True, True, True), (True, True, False))
    np.testing.assert_array_equal(request.head_mask_array(), mask)
    with pytest.raises(ValueError, match="head_mask"):
        TraceRequest("bert", head_mask=np.ones(4, dtype=bool))


def test_bad_options_fail_at_the_request_with_a_message():
    with pytest.raises(ValueError, match="model must be"):
        TraceRequest("gpt")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        TraceRequest("custom", num_attention_heads=5, hidden_size=32)  # 32 is not divisible by 5
    with pytest.raises(ValueError, match="no custom encoder spec"):
        TraceRequest("bert").spec()


def test_walk_spec_of_bert_is_the_loaded_from_bert_custom_encoder():
    assert TraceRequest("bert").walk_spec(BUNDLED_MODEL_ID) == CustomSpec(
        weights="pretrained", seed=0, norm_placement="post", model_id=BUNDLED_MODEL_ID)
    custom = TraceRequest("custom", causal=True, num_hidden_layers=2, num_attention_heads=2, hidden_size=16, seed=4)
    assert custom.walk_spec() == custom.spec() == CustomSpec(seed=4, causal=True, num_hidden_layers=2, num_attention_heads=2,
                                                             hidden_size=16)


def test_the_corpus_model_of_a_request_is_the_trace_model():
    request = TraceRequest("custom", "text", num_hidden_layers=2, num_attention_heads=3, hidden_size=48, seed=1, causal=True)
    assert CorpusModel.from_request(request).custom == request.spec()
    assert CorpusModel.from_options("custom", num_hidden_layers=2, num_attention_heads=3, hidden_size=48, seed=1,
                                    causal=True) == CorpusModel.from_request(request)
    assert CorpusModel.from_request(TraceRequest("bert")) == CorpusModel("bert", BUNDLED_MODEL_ID)


def test_build_trace_runs_the_request():
    request = TraceRequest("custom", "time flies", "fast", causal=True, num_hidden_layers=2, num_attention_heads=2, hidden_size=16)
    trace = build_trace(request, device="cpu")
    assert (trace.n_layers, trace.n_heads, trace.causal) == (2, 2, True)
    assert trace.sentence_b_start is not None
    masked = build_trace(TraceRequest("custom", "time flies", "fast", causal=True, num_hidden_layers=2, num_attention_heads=2,
                                      hidden_size=16, head_mask=[[True, False], [True, True]]), device="cpu")
    assert not masked.weights[0, 1].any() and masked.weights[0, 0].any()


def test_the_app_keeps_its_models_in_one_cache():
    """The app's loaders take models from st.cache_resource only: nothing lands in model_core's own cache,
    so Streamlit's eviction frees them."""
    from model_core.models.loading import kept_lookups as lookups
    from model_core.models.loading import load_pretrained
    from ui.loaders import get_pretrained, get_trace

    # Hits count too: in a full run the bundled model may already be in model_core's cache, and a loader that went
    # through it would be a hit that leaves the cache's size unchanged.
    before = lookups()
    load_pretrained(None, device="cpu")  # the control: model_core's own loader counts
    assert lookups() == before + 1
    before = lookups()
    get_pretrained.clear()
    get_trace.clear()
    trace = get_trace(TraceRequest("bert", "a short text"))
    assert trace.model_kind == "bert"
    assert lookups() == before
    get_trace(TraceRequest("custom", "a short text", weights="pretrained"))
    assert lookups() == before


def test_a_request_without_a_model_id_runs_the_deployments_default():
    from model_core.settings import Settings
    from model_core.trace.resolve import model_id_of

    settings = Settings(default_model="some/bert")
    assert model_id_of(TraceRequest("pretrained", "a"), settings) == "some/bert"
    assert model_id_of(TraceRequest("pretrained", "a", model_id="other/bert"), settings) == "other/bert"
    assert model_id_of(TraceRequest("custom", "a", weights="pretrained"), settings) == "some/bert"
    assert model_id_of(TraceRequest("custom", "a"), settings) is None  # random weights


@pytest.mark.parametrize("typed, expected", [
    (None, "some/bert"), ("  ", "some/bert"),  # none: the deployment's default
    (" bundled ", BUNDLED_MODEL_ID), (BUNDLED_MODEL_ID, BUNDLED_MODEL_ID),  # the alias and the bundled id
    ("bundled:SmolLM2-135M-Instruct", "bundled:SmolLM2-135M-Instruct"),
    (" org/model ", "org/model"), ("./a/folder", "./a/folder"),  # hub ids and folders as written
])
def test_the_sidebar_a_request_and_loading_resolve_a_model_id_alike(typed, expected):
    """One rule (``resolve_model_id``) for the sidebar's box, a request and the loader."""
    from model_core.models.loading import resolve_model_source
    from model_core.settings import Settings, resolve_model_id
    from model_core.trace.resolve import model_id_of
    from ui.state import chosen_model_id

    settings = Settings(default_model="some/bert")
    assert resolve_model_id(typed, settings) == expected
    assert chosen_model_id({"ctl_model_id": typed}, settings) == expected
    request = TraceRequest("pretrained", "a", model_id=typed)
    assert request.model_id == (None if expected == "some/bert" else expected)  # the default stays None until run
    assert model_id_of(request, settings) == expected
    if expected == BUNDLED_MODEL_ID:
        assert resolve_model_source(typed, settings).model_id == BUNDLED_MODEL_ID  # offline: the bundled folder


def test_the_form_decision_and_the_build_tokenise_the_text_once(tiny_decoders, monkeypatch):
    from model_core.compact.build import build_compact, trace_form
    from model_core.families.decoder import DecoderFamily
    from model_core.settings import load_settings

    calls = []
    encode = DecoderFamily.encode
    monkeypatch.setattr(DecoderFamily, "encode", lambda self, *a, **k: calls.append(a[1]) or encode(self, *a, **k))
    text = "the river bank where the children play, tokenised once"
    request = TraceRequest("pretrained", text, model_id=str(tiny_decoders["llama"]))
    form = trace_form(request, device="cpu")
    trace = build_trace(request, device="cpu")
    compact = build_compact(request, device="cpu", max_tokens=load_settings().max_tokens)  # as the app asks
    assert calls == [text]
    assert form.n_tokens == trace.n_tokens == compact.n_tokens
    build_trace(TraceRequest("pretrained", text + " and more", model_id=request.model_id), device="cpu")
    assert len(calls) == 2  # another text is tokenised
