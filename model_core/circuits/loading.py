"""A pretrained decoder by id, ready for edge attribution (the local engine's and every Ray worker's own copy)."""

from __future__ import annotations

from typing import Any

import torch

from model_core.circuits.eap import CircuitModel, circuit_model
from model_core.trace.request import TraceRequest
from model_core.trace.resolve import resolve


def load_circuit_model(model_id: str | None = None, *, device: str | torch.device | None = None,
                       settings: Any = None, models: Any = None) -> CircuitModel:
    """A pretrained decoder by id (the deployment's default for None), ready for edge attribution.

    Raises:
        ModelLoadError: it cannot be loaded. CircuitModelError: not a decoder this engine can attribute.
    """
    resolved = resolve(TraceRequest("pretrained", "", "", model_id=model_id), device=device, settings=settings,
                       models=models)
    return circuit_model(resolved.model, resolved.tokenizer)
