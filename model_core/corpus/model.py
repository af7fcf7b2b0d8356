"""Which model a corpus runs through, and a loaded copy that gives the attention weights of a padded batch."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import torch

from model_core.corpus.stats import TokenClasses
from model_core.loading import LoadedModel, load_pretrained, load_tokenizer, select_device
from model_core.settings import BUNDLED_MODEL_ID, Settings, load_settings

if TYPE_CHECKING:
    from model_core.request import TraceRequest
from model_core.custom_spec import CustomSpec, build_custom_model, describe_custom


@dataclass(frozen=True)
class CorpusModel:
    """What identifies the model of a corpus run; ``key()`` is what a run folder records.

    Attributes:
        kind: "bert" (transformers' BertModel) or "custom" (the chapter-3 encoder).
        model_id: the BERT to load, or whose weights the custom encoder takes; None for random weights.
        custom: the custom encoder's spec (kind "custom" only).
    """

    kind: Literal["bert", "custom"]
    model_id: str | None = None
    custom: CustomSpec | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("bert", "custom"):
            raise ValueError(f"model must be 'bert' or 'custom', got {self.kind!r}.")
        if (self.kind == "custom") != (self.custom is not None):
            raise ValueError("A custom model needs a CustomSpec, and a BERT must not have one.")

    @classmethod
    def from_request(cls, request: "TraceRequest") -> "CorpusModel":
        """The model of a trace request (its text and head mask play no part); no id means the bundled model."""
        if request.model == "bert":
            return cls("bert", request.model_id or BUNDLED_MODEL_ID)
        spec = request.spec(BUNDLED_MODEL_ID)
        return cls("custom", spec.model_id, spec)

    @classmethod
    def from_options(cls, model: str, model_id: str | None = None, *, weights: str = "random", seed: int = 0,
                     causal: bool = False, norm_placement: str = "pre", num_layers: int = 12, num_heads: int = 12,
                     hidden_size: int = 768) -> "CorpusModel":
        """From the command line's options (those that do not apply are ignored), through a TraceRequest."""
        from model_core.request import TraceRequest

        if model not in ("bert", "custom"):
            raise ValueError(f"--model must be 'bert' or 'custom', got {model!r}.")
        return cls.from_request(TraceRequest(
            model, "", model_id=model_id, weights=weights, seed=seed, causal=causal,  # type: ignore[arg-type]
            norm_placement=norm_placement, num_layers=num_layers, num_heads=num_heads,  # type: ignore[arg-type]
            hidden_size=hidden_size))

    def key(self) -> dict[str, Any]:
        """A JSON-able identity: two runs of equal keys ran the same model."""
        if self.kind == "bert":
            return {"kind": "bert", "model_id": self.model_id}
        return {"kind": "custom", **asdict(self.custom)}  # type: ignore[arg-type]

    @classmethod
    def from_key(cls, key: dict[str, Any]) -> "CorpusModel":
        """The inverse of ``key()``."""
        key = dict(key)
        kind = key.pop("kind", None)
        if kind == "bert":
            return cls("bert", key.get("model_id"))
        spec = CustomSpec(**key)
        return cls("custom", spec.model_id, spec)

    def label(self) -> str:
        """A short name for messages."""
        if self.kind == "bert":
            return f"BERT {self.model_id}"
        s = self.custom
        assert s is not None
        weights = f"BERT weights of {s.model_id}" if s.weights == "pretrained" else f"random weights, seed {s.seed}"
        return (f"custom encoder ({weights}, {s.num_layers}x{s.num_heads}, hidden {s.hidden_size}, "
                f"{s.norm_placement}-LN, {'causal' if s.causal else 'bidirectional'})")

    def tokenizer(self) -> Any:
        """The model's WordPiece tokenizer, without loading the model where it can be avoided."""
        if self.kind == "custom":
            return load_tokenizer(self.model_id)
        from model_core.loading import resolve_model_source

        source = resolve_model_source(self.model_id)
        if source.kind == "bundled":
            return load_tokenizer(None)
        return load_pretrained(self.model_id).tokenizer

    def load(self, device: str | torch.device | None = None, settings: Settings | None = None) -> "LoadedCorpusModel":
        """Load (or build) the model on ``device`` (default: the settings', cuda → mps → cpu)."""
        settings = settings or load_settings()
        dev = device if isinstance(device, torch.device) else select_device(device or settings.device)
        if self.kind == "bert":
            return LoadedCorpusModel.from_bert(self, load_pretrained(self.model_id, device=dev, settings=settings))
        assert self.custom is not None
        module = build_custom_model(self.custom, dev)
        return LoadedCorpusModel.from_custom(self, module, load_tokenizer(self.custom.model_id))


class BatchVectors(NamedTuple):
    """Per-layer vectors of a padded batch, for the token sample (queries/keys of every head side by side).

    Shape: queries, keys: layer tensors of (batch, pos, hidden), head h in columns h*d_head:(h+1)*d_head;
    hidden: layer + 1 tensors of (batch, pos, hidden) (the embeddings first). Either may be None.
    """

    queries: list[torch.Tensor] | None
    keys: list[torch.Tensor] | None
    hidden: list[torch.Tensor] | None


@dataclass(frozen=True, eq=False)
class LoadedCorpusModel:
    """A model ready for batches: the module, its tokenizer, its device and its token classes."""

    spec: CorpusModel
    module: Any
    tokenizer: Any
    device: torch.device
    description: str
    n_layers: int
    n_heads: int
    max_positions: int
    classes: TokenClasses
    hidden_size: int

    @classmethod
    def from_bert(cls, spec: CorpusModel, loaded: LoadedModel) -> "LoadedCorpusModel":
        c = loaded.model.config
        return cls(spec, loaded.model, loaded.tokenizer, loaded.device, loaded.description, c.num_hidden_layers,
                   c.num_attention_heads, c.max_position_embeddings, TokenClasses.from_tokenizer(loaded.tokenizer),
                   c.hidden_size)

    @classmethod
    def from_custom(cls, spec: CorpusModel, module: Any, tokenizer: Any) -> "LoadedCorpusModel":
        c = module.config
        assert spec.custom is not None
        return cls(spec, module, tokenizer, next(module.parameters()).device, describe_custom(spec.custom, module),
                   c.num_hidden_layers, c.num_attention_heads, c.max_position_embeddings,
                   TokenClasses.from_tokenizer(tokenizer), c.hidden_size)

    def layer_weights(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                      attention_mask: torch.Tensor) -> list[torch.Tensor]:
        """Attention weights of every layer for a padded batch already on ``device``.

        Shape: inputs (batch, pos) -> layer tensors of (batch, head, q_pos, k_pos).
        """
        return self.forward(input_ids, token_type_ids, attention_mask)[0]

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                qk: bool = False, hidden: bool = False) -> tuple[list[torch.Tensor], BatchVectors]:
        """The attention weights of every layer and, when asked, the queries/keys and hidden states.

        Shape: inputs (batch, pos); weights as ``layer_weights``; vectors as ``BatchVectors``.
        """
        if self.spec.kind == "bert":
            captured: dict[tuple[int, str], torch.Tensor] = {}
            handles = []
            if qk:
                for i, layer in enumerate(self.module.encoder.layer):
                    for name in ("query", "key"):
                        module = getattr(layer.attention.self, name)
                        handles.append(module.register_forward_hook(
                            lambda _m, _i, out, key=(i, name): captured.__setitem__(key, out)))
            try:
                out = self.module(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask,
                                  output_attentions=True, output_hidden_states=hidden)
            finally:
                for h in handles:
                    h.remove()
            if not out.attentions or out.attentions[0] is None:
                raise RuntimeError("The model returned no attentions; load it with attn_implementation='eager'.")
            pick = (lambda name: [captured[(i, name)] for i in range(self.n_layers)]) if qk else (lambda name: None)
            return list(out.attentions), BatchVectors(pick("query"), pick("key"),
                                                      list(out.hidden_states) if hidden else None)
        out = self.module(input_ids, token_type_ids, attention_mask)
        layers = out.encoder.layers
        weights = [torch.stack([h.step.weights for h in layer.heads], dim=1) for layer in layers]
        cat = (lambda attr: [torch.cat([getattr(h, attr) for h in layer.heads], dim=-1) for layer in layers]) \
            if qk else (lambda attr: None)
        return weights, BatchVectors(cat("query"), cat("key"), list(out.encoder.hidden_states) if hidden else None)
