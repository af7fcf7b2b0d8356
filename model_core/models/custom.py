"""Build the custom encoder (the chapter-3 encoder) a ``CustomSpec`` describes: seeded random weights, or a BERT
checkpoint's weights loaded through ``model_core.models.loading``."""

from __future__ import annotations

import torch

from model_core.chapter3.from_bert import custom_from_bert
from model_core.chapter3.model import TransformerForSequenceClassification, build_random_model
from model_core.chapter3.spec import CustomSpec
from model_core.models.errors import ModelLoadError
from model_core.models.loading import load_pretrained_uncached

__all__ = ["build_custom_model"]


def build_custom_model(spec: CustomSpec, device: torch.device | str = "cpu") -> TransformerForSequenceClassification:
    """Build the custom encoder a spec describes, on ``device``, in eval mode."""
    if spec.weights == "pretrained":
        loaded = load_pretrained_uncached(spec.model_id, device="cpu")  # its weights are copied; no cache keeps it
        if loaded.family.name != "bert":
            raise ModelLoadError(
                f"{spec.model_id!r} is a {loaded.model.config.model_type!r} model ({loaded.family.label}); the custom "
                "encoder takes the weights of an encoder of the BERT family. Pick a BERT checkpoint, or choose "
                "Pretrained model to look at this model itself.")
        model = custom_from_bert(loaded.model, seed=spec.seed, causal=spec.causal)
    else:
        model = build_random_model(spec.config(), spec.seed)
    for p in model.parameters():
        p.requires_grad_(False)
    return model.to(device).eval()
