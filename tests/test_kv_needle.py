"""The needle test's batched greedy decoding from compressed caches equals a cache-free masked reference
(tests/kv_reference.py), row by row; and its result's table."""

from __future__ import annotations

import kv_reference as ref_kv
import numpy as np
from tiny_models import CORPUS

from model_core.generate.kv import plan_kv
from model_core.generate.needle import (
    ANSWER,
    HAYSTACK,
    NeedleResult,
    decode_batch,
    needle_prompt,
)
from model_core.generate.presses import kept_positions
from model_core.models.loading import load_pretrained


def test_batched_decoding_from_compressed_caches_equals_the_masked_reference(tiny_decoders):
    folder = str(tiny_decoders["llama"])
    loaded = load_pretrained(folder)
    ids = np.array(loaded.tokenizer(CORPUS).input_ids[:90])
    plan = plan_kv(loaded.family, loaded.model, ids, ("snapkv", "knorm"))
    kept = [kept_positions(plan.orders["snapkv"], 60), kept_positions(plan.orders["knorm"], 20)]
    texts = decode_batch(loaded.family, loaded.model, plan, kept, loaded.tokenizer, steps=4)
    ref = ref_kv.eager_reference(folder, ids)
    for text, positions in zip(texts, kept):
        assert text == loaded.tokenizer.decode(ref_kv.masked_greedy(ref, positions.tolist(), 4))
    assert texts[0] != texts[1]  # the two caches decode differently: the comparison can fail


def test_the_needle_is_one_fact_in_the_middle_of_the_text():
    assert HAYSTACK.count(ANSWER) == 1
    at = HAYSTACK.index(ANSWER) / len(HAYSTACK)
    assert 0.3 < at < 0.7
    assert needle_prompt().endswith("He keeps it in a")


def test_needle_rows_start_with_the_full_cache():
    result = NeedleResult(("tova",), (0.5, 0.9), np.array([[True, False]]),
                          np.array([[" green teapot", " box"]], dtype=object), " green teapot", True, 500)
    rows = result.to_rows()
    assert rows[0] == {"press": "full cache", "compression_ratio": 0.0, "passed": True, "answer": " green teapot"}
    assert [r["passed"] for r in rows[1:]] == [True, False]
