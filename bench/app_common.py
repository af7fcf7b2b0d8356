"""bench_app's shared settings: the models it runs (as the sidebar's requests), page constants, and number formats."""

from __future__ import annotations

import statistics

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from model_core.trace.request import MODEL_FIELDS, TraceRequest  # noqa: E402
from ui.fields import request_params  # noqa: E402

MODEL_REQUESTS = {  # label -> the sidebar's request for that model (custom: bert-base shape is the default)
    "custom 12x12x768": TraceRequest("custom", num_hidden_layers=12, num_attention_heads=12, hidden_size=768),
    "bundled BERT 6x12x384": TraceRequest("pretrained", model_id="bundled:all-MiniLM-L6-v2"),
    "SmolLM2-135M decoder 30x9": TraceRequest("pretrained", model_id="bundled:SmolLM2-135M-Instruct"),
}
MODEL_PARAMS = {label: request_params(request, MODEL_FIELDS) for label, request in MODEL_REQUESTS.items()}
"""label -> the query parameters that pick the model (ui.fields, from the request's fields)."""
N_FIGURES = 3  # heatmaps page: overview, focused head, the four summary grids in one figure
TIMEOUT_MS = 120_000


def med(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.2f} s"
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def mb(n: float | None) -> str:
    if n is None:
        return "pending"
    return f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"
