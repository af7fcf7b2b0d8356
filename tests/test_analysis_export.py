"""CSV, NPZ and JSON export of the analyses."""

import csv
import io
import json

import numpy as np

from model_core.analysis.export import analysis_arrays
from model_core.io.export import to_json_str, to_npz_bytes
from model_core.analysis.per_head import STAT_NAMES, head_stats
from model_core.analysis.rollout import FLOW_MAX_TOKENS
from model_core.io.tables import grid_to_csv, matrix_to_csv, rows_to_csv
from synthetic import synthetic_trace


def test_matrix_csv_round_trips_with_labels_and_blank_nan():
    m = np.array([[0.25, np.nan], [1.0, 2.5]])
    rows = list(csv.reader(io.StringIO(matrix_to_csv(m, ["[CLS]", "a,b"], ["x", "y"]))))
    assert rows == [["", "x", "y"], ["[CLS]", "0.25", ""], ["a,b", "1.0", "2.5"]]


def test_grid_csv_names_layers_and_heads():
    text = grid_to_csv(np.arange(6.0).reshape(2, 3))
    assert text.splitlines()[0] == ",head 0,head 1,head 2"
    assert text.splitlines()[2] == "layer 1,3.0,4.0,5.0"


def test_head_stats_rows_csv_has_a_row_per_head():
    stats = head_stats(synthetic_trace(13, 2, 3))
    rows = list(csv.DictReader(io.StringIO(rows_to_csv(stats.to_rows()))))
    assert len(rows) == 6 and float(rows[4]["to_cls"]) == float(stats.to_cls[1, 1])


def test_npz_bytes_round_trip():
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "tokens": np.asarray(["[CLS]", "x"])}
    loaded = np.load(io.BytesIO(to_npz_bytes(arrays)))
    np.testing.assert_array_equal(loaded["a"], arrays["a"])
    assert loaded["tokens"].tolist() == ["[CLS]", "x"]


def test_json_turns_nan_into_null():
    data = json.loads(to_json_str({"grid": np.array([[1.5, np.nan]]), "n": np.int64(3), "ok": np.bool_(True)}))
    assert data == {"grid": [[1.5, None]], "n": 3, "ok": True}


def test_analysis_arrays_has_every_analysis_and_drops_flow_past_the_limit():
    small = analysis_arrays(synthetic_trace(13, 2, 3))
    assert small["rollout"].shape == (2, 13, 13) and small["flow"].shape == (13, 13)
    assert small["norm_weighted"].shape == (2, 3, 13, 13)
    assert "norm_weighted" not in analysis_arrays(synthetic_trace(13, 2, 3), per_head_matrices=False)
    assert {f"head_stats/{n}" for n in STAT_NAMES} <= set(small)
    assert small["special_mass/norm_sep"].shape == (2, 3)
    big = analysis_arrays(synthetic_trace(FLOW_MAX_TOKENS + 1, 1, 1))
    assert "flow" not in big and big["rollout"].shape[-1] == FLOW_MAX_TOKENS + 1
