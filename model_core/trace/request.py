"""The one route from a choice of model and text to numbers: a TraceRequest, and build_trace that runs it.

The sidebar, the walk-through, the command line and the tests describe what they want as a ``TraceRequest``.
``resolve`` (``model_core.trace.resolve``) loads its model once and tokenises its text once; ``build_trace`` then
runs the family's one forward pass (``Family.forward``, ``model_core.trace.forward``) under the route's gate
(``model_core.gate``) into an ``AttentionTrace``. Every other pass takes the same steps: a long input's
compact trace (``model_core.compact.build``), both walks (``model_core.walk.build``), head masking's second run
(``model_core.analysis.masked_run``) and a corpus's padded batches (``CorpusModel.load``). The app only caches
these.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal

import numpy as np
import torch

from model_core.chapter3.spec import CustomOptions, CustomSpec
from model_core.families.encoding import DEFAULT_TEXT_A
from model_core.settings import Settings, resolve_model_id
from model_core.trace.forward import trace_custom, trace_pretrained
from model_core.trace.resolve import Models, resolve, token_limit
from model_core.trace.sequence import with_reply
from model_core.trace.trace import AttentionTrace

__all__ = ["MODEL_FIELDS", "Models", "REQUEST_FIELDS", "TEXT_FIELDS", "TraceRequest", "build_trace", "token_limit"]

_CUSTOM_ONLY = tuple(f.name for f in fields(CustomOptions))
_SHAPE = ("norm_placement", "num_hidden_layers", "num_attention_heads", "hidden_size")


@dataclass(frozen=True)
class TraceRequest(CustomOptions):
    """Everything that identifies one trace: the model, its options, the text, and which heads are on.

    Options that do not apply are set to their defaults on creation, so two requests for the same trace
    are equal (and hash equal): a pretrained model ignores the custom encoder's options; BERT weights fix the
    custom encoder's shape and post-LayerNorm; random weights ignore ``model_id``; a head mask with every head on
    is no mask.

    Attributes:
        model: "pretrained" (a transformers model of any supported family: BERT, GPT-2, Llama-like; which one is
            ``model_id``'s config) or "custom" (the chapter-3 encoder). "bert", the old name, means "pretrained".
        text_a: sentence A.
        text_b: sentence B, or "" for one sentence.
        model_id: the pretrained model to run, or the BERT whose weights the custom encoder takes; None means the deployment's
            default (``Settings.default_model``).
        weights, seed, causal, norm_placement, num_hidden_layers, num_attention_heads, hidden_size: the custom encoder's
            options (``CustomOptions``), keyword-only.
        truncate: keep the first tokens of a text over the limit instead of refusing it.
        head_mask: which heads are on, (layer, head) of bools; None = all.
        token_ids: a generated sequence's own ids (``model_core.generate``), or None. The model reads them instead of
            tokenising ``text_a`` while they still describe it (``text_a`` is their decoding with special tokens
            kept, and there is no sentence B): re-tokenising a reply may split it otherwise. An edited text, or
            another tokenizer, is tokenised as typed. A link carries them as comma-separated ids.
        reply_start: where the generated reply starts among ``token_ids`` (its first token's position), or None;
            the trace's ``reply_start``, which every page marks on its token axes.
    """

    model: Literal["pretrained", "custom"] = "pretrained"
    text_a: str = DEFAULT_TEXT_A
    text_b: str = ""
    model_id: str | None = None
    truncate: bool = False
    head_mask: tuple[tuple[bool, ...], ...] | None = field(default=None)
    token_ids: tuple[int, ...] | None = None
    reply_start: int | None = None

    def __post_init__(self) -> None:
        put = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 - frozen
        if self.model == "bert":  # the old name, in links and scripts
            put("model", "pretrained")
        if self.model not in ("pretrained", "custom"):
            raise ValueError(f"model must be 'pretrained' or 'custom', got {self.model!r}.")
        defaults = {f.name: f.default for f in fields(self)}
        put("text_a", self.text_a or "")
        put("text_b", self.text_b or "")
        put("model_id", resolve_model_id(self.model_id, default=False))  # None: the default it is resolved under
        for name in ("seed", "num_hidden_layers", "num_attention_heads", "hidden_size"):
            put(name, int(getattr(self, name)))
        put("causal", bool(self.causal))
        put("truncate", bool(self.truncate))
        if self.head_mask is not None:
            mask = np.asarray(self.head_mask, dtype=bool)
            if mask.ndim != 2:
                raise ValueError(f"head_mask must be (layer, head) of bools, got shape {mask.shape}.")
            put("head_mask", None if mask.all() else tuple(tuple(bool(v) for v in row) for row in mask))
        self._normalise_reply(put)
        if self.model == "pretrained":
            for name in _CUSTOM_ONLY:
                put(name, defaults[name])
            return
        if self.weights == "pretrained":
            for name in _SHAPE:  # BERT's weights bring their own shape, and BERT is post-LN
                put(name, defaults[name])
            put("norm_placement", "post")
        else:
            put("model_id", None)
        self.spec()  # validates the custom encoder's options

    def _normalise_reply(self, put) -> None:
        """``token_ids`` as a tuple of ints (a link gives "1,2,3") and ``reply_start`` within them; both None where
        they cannot apply (the custom encoder, a sentence pair, no ids)."""
        ids, start = self.token_ids, self.reply_start
        if isinstance(ids, str):
            try:
                ids = [int(v) for v in ids.split(",") if v.strip()]
            except ValueError:
                raise ValueError("token_ids must be comma-separated token ids, e.g. 1,2,3.") from None
        ids = None if ids is None else tuple(int(v) for v in ids)
        if self.model != "pretrained" or self.text_b or not ids:
            put("token_ids", None)
            put("reply_start", None)
            return
        if any(v < 0 for v in ids):
            raise ValueError("token_ids must be token ids (0 or more).")
        put("token_ids", ids)
        if start in (None, ""):
            put("reply_start", None)
            return
        start = int(start)
        if not 0 < start < len(ids):
            raise ValueError(f"reply_start {start} is outside the generated ids: it must be 1-{len(ids) - 1}.")
        put("reply_start", start)

    def spec(self, default_model: str | None = None) -> CustomSpec:
        """The custom encoder this request runs; ``default_model`` stands in for a ``model_id`` of None.

        Raises:
            ValueError: the request is for a pretrained model, or an option is out of range.
        """
        if self.model != "custom":
            raise ValueError("A pretrained model's request has no custom encoder spec; use walk_spec() for the walk-through.")
        return CustomSpec(**{name: getattr(self, name) for name in _CUSTOM_ONLY},
                          model_id=(self.model_id or default_model) if self.weights == "pretrained" else None)

    def walk_spec(self, default_model: str | None = None) -> CustomSpec:
        """The from-scratch encoder the "Inside the encoder" walk runs in.

        For BERT that is its weights loaded into the custom encoder (post-LN, classifier head random with
        seed 0): the same spec as the custom encoder "Loaded from BERT" with seed 0 and no causal mask, so
        the two share one cached model.
        """
        if self.model == "pretrained":
            return CustomSpec(weights="pretrained", seed=0, causal=False, norm_placement="post",
                              model_id=self.model_id or default_model)
        return self.spec(default_model)

    def head_mask_array(self) -> np.ndarray | None:
        """The head mask as an array, or None when every head is on. Shape: (layer, head) bool."""
        return None if self.head_mask is None else np.array(self.head_mask, dtype=bool)


REQUEST_FIELDS = tuple(f.name for f in fields(TraceRequest) if f.name != "head_mask")
"""The fields a user sets: the sidebar's controls, a link's query parameters and a corpus run's "open in the
sidebar" are these, by these names (the head mask is the masking page's own)."""
TEXT_FIELDS = ("text_a", "text_b", "truncate", "token_ids", "reply_start")
"""The request's fields that say what text it reads (a generated one's ids and reply among them)."""
MODEL_FIELDS = tuple(name for name in REQUEST_FIELDS if name not in TEXT_FIELDS)
"""The request's fields that name a model (a pretrained one by ``model`` and ``model_id`` alone)."""


def build_trace(request: TraceRequest, *, device: str | torch.device | None = None,
                settings: Settings | None = None, models: Models | None = None) -> AttentionTrace:
    """Run the request's model once on its text and collect the trace.

    Args:
        request: what to run.
        device: "auto", "cpu", "cuda", "mps" or a torch device; default: the settings' (cuda → mps → cpu).
        settings: the deployment's settings (default: read from the environment).
        models: where the models come from (default: ``Models()``).

    Raises:
        InputError: the text cannot be traced.
        ModelLoadError: the pretrained model cannot be loaded.
        ValueError: an option is out of range.
    """
    resolved = resolve(request, device=device, settings=settings, models=models)
    encoded = resolved.encode(request)  # a generated sequence's own ids, while they describe its text
    if resolved.loaded is not None:
        return with_reply(trace_pretrained(resolved.loaded, encoded, request.head_mask_array()), request, encoded)
    return trace_custom(resolved.model, encoded, resolved.description, request.head_mask_array())

