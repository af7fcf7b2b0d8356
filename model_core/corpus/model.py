"""Which model a corpus runs through, and a loaded copy that runs padded batches through the model family's one
forward pass (``Family.forward``, the same pass a single trace takes, under the same gate). The model is resolved as
a trace's is (``model_core.trace.resolve.resolve``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import torch
from transformers import AutoConfig

from model_core.corpus.stats import TokenClasses
from model_core.chapter3.spec import CustomSpec
from model_core.families import FAMILIES, Family, family_of, family_of_config
from model_core.models.loading import load_tokenizer, resolve_model_source
from model_core.settings import Settings, resolve_model_id
from model_core.trace.request import TraceRequest
from model_core.trace.resolve import Models, resolve

if TYPE_CHECKING:
    from model_core.trace.request import TraceRequest

_OLD_KIND = {"bert": "pretrained"}  # run folders written before decoders named every pretrained model "bert"
_OLD_SHAPE_NAMES = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads"}  # before EncoderConfig's names


@dataclass(frozen=True)
class CorpusModel:
    """What identifies the model of a corpus run; ``key()`` is what a run folder records.

    Attributes:
        kind: "pretrained" (a transformers model of any supported family) or "custom" (the chapter-3 encoder);
            "bert", the old name, means "pretrained".
        model_id: the pretrained model, or the BERT whose weights the custom encoder takes; None for random weights.
        custom: the custom encoder's spec (kind "custom" only).
    """

    kind: Literal["pretrained", "custom"]
    model_id: str | None = None
    custom: CustomSpec | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", _OLD_KIND.get(self.kind, self.kind))
        if self.kind not in ("pretrained", "custom"):
            raise ValueError(f"model must be 'pretrained' or 'custom', got {self.kind!r}.")
        if (self.kind == "custom") != (self.custom is not None):
            raise ValueError("A custom model needs a CustomSpec, and a pretrained model must not have one.")

    @classmethod
    def from_request(cls, request: "TraceRequest") -> "CorpusModel":
        """The model of a trace request (its text and head mask play no part); no id means the deployment's default
        (``resolve_model_id``: the bundled BERT unless AE_DEFAULT_MODEL says otherwise), as for a trace."""
        if request.model == "pretrained":
            return cls("pretrained", resolve_model_id(request.model_id))
        spec = request.spec(resolve_model_id(None))
        return cls("custom", spec.model_id, spec)

    @classmethod
    def from_options(cls, model: str, model_id: str | None = None, *, weights: str = "random", seed: int = 0,
                     causal: bool = False, norm_placement: str = "pre", num_hidden_layers: int = 12, num_attention_heads: int = 12,
                     hidden_size: int = 768) -> "CorpusModel":
        """From the command line's options (those that do not apply are ignored), through a TraceRequest."""
        if model not in ("pretrained", "bert", "custom"):
            raise ValueError(f"--model must be 'pretrained' or 'custom', got {model!r}.")
        return cls.from_request(TraceRequest(
            model, "", model_id=model_id, weights=weights, seed=seed, causal=causal,  # type: ignore[arg-type]
            norm_placement=norm_placement, num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,  # type: ignore[arg-type]
            hidden_size=hidden_size))

    @property
    def model(self) -> str:
        """The kind, under the name a ``TraceRequest`` gives it (``model_core.trace.resolve.ModelChoice``)."""
        return self.kind

    def spec(self, default_model: str | None = None) -> CustomSpec:
        """The custom encoder's spec (``ModelChoice``).

        Raises:
            ValueError: the model is pretrained.
        """
        if self.custom is None:
            raise ValueError("A pretrained model has no custom encoder spec.")
        return self.custom

    def key(self) -> dict[str, Any]:
        """A JSON-able identity: two runs of equal keys ran the same model."""
        if self.kind == "pretrained":
            return {"kind": "pretrained", "model_id": self.model_id}
        return {"kind": "custom", **asdict(self.custom)}  # type: ignore[arg-type]

    @classmethod
    def from_key(cls, key: dict[str, Any]) -> "CorpusModel":
        """The inverse of ``key()``; also reads the keys of older run folders ("bert", "num_layers", "num_heads")."""
        key = {_OLD_SHAPE_NAMES.get(name, name): value for name, value in key.items()}
        raw = key.pop("kind", None)
        kind = _OLD_KIND.get(raw, raw)
        if kind == "pretrained":
            return cls("pretrained", key.get("model_id"))
        spec = CustomSpec(**key)
        return cls("custom", spec.model_id, spec)

    def label(self) -> str:
        """A short name for messages."""
        if self.kind == "pretrained":
            return f"pretrained model {self.model_id}"
        s = self.custom
        assert s is not None
        weights = f"BERT weights of {s.model_id}" if s.weights == "pretrained" else f"random weights, seed {s.seed}"
        return (f"custom encoder ({weights}, {s.num_hidden_layers}x{s.num_attention_heads}, hidden {s.hidden_size}, "
                f"{s.norm_placement}-LN, {'causal' if s.causal else 'bidirectional'})")

    def family(self) -> Family:
        """The model's family, from its config alone (no weights loaded)."""
        if self.kind == "custom":
            return FAMILIES["custom"]

        source = resolve_model_source(self.model_id)
        config = AutoConfig.from_pretrained(source.location, local_files_only=source.kind != "hub")
        return family_of_config(config, self.model_id)

    def tokenizer(self) -> Any:
        """The model's tokenizer (for the bundled BERT vocabulary, without loading a model)."""
        return load_tokenizer(self.model_id)

    def load(self, device: str | torch.device | None = None, settings: Settings | None = None,
             models: Models | None = None) -> "LoadedCorpusModel":
        """Load (or build) the model on ``device`` (default: the settings', cuda → mps → cpu) from ``models``
        (default: ``model_core.Models()``; the app passes its cached ones), the same models traces use, resolved as
        a trace's are (``resolve``)."""
        resolved = resolve(self, device=device, settings=settings, models=models)
        return LoadedCorpusModel.build(self, resolved.model, resolved.tokenizer, resolved.description)


class BatchVectors(NamedTuple):
    """Per-layer vectors of a padded batch, for the token sample (queries/keys of every head side by side).

    Shape: queries, keys: layer tensors of (batch, pos, head * d_head), head h in columns h*d_head:(h+1)*d_head
    (keys of grouped-query attention repeated per query head); hidden: layer + 1 tensors of (batch, pos, hidden)
    (the embeddings first). Either may be None.
    """

    queries: list[torch.Tensor] | None
    keys: list[torch.Tensor] | None
    hidden: list[torch.Tensor] | None


@dataclass(frozen=True, eq=False)
class LoadedCorpusModel:
    """A model ready for batches: the module, its family, its tokenizer, its device and its token classes."""

    spec: CorpusModel
    module: Any
    family: Family
    tokenizer: Any
    device: torch.device
    description: str
    n_layers: int
    n_heads: int
    max_positions: int
    classes: TokenClasses
    hidden_size: int

    @classmethod
    def build(cls, spec: CorpusModel, module: Any, tokenizer: Any, description: str) -> "LoadedCorpusModel":
        family = family_of(module)
        c = module.config
        return cls(spec, module, family, tokenizer, next(module.parameters()).device, description,
                   family.n_layers(c), family.n_heads(c), family.max_positions(c),
                   TokenClasses.from_tokenizer(tokenizer, first_token=family.is_decoder), c.hidden_size)

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
        out = self.family.forward(self.module, input_ids, token_type_ids, attention_mask, vectors=qk, hidden=hidden)
        side_by_side = None
        if qk:
            kv = torch.as_tensor(self.family.kv_heads(self.module.config), device=self.device)
            # (batch, head, pos, d_head) -> (batch, pos, head * d_head)
            flat = lambda t: t.permute(0, 2, 1, 3).flatten(2)  # noqa: E731
            side_by_side = ([flat(q) for q in out.queries], [flat(k.index_select(1, kv)) for k in out.keys])
        return list(out.weights), BatchVectors(side_by_side[0] if qk else None, side_by_side[1] if qk else None,
                                               list(out.hidden) if hidden else None)
