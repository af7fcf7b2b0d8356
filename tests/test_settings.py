"""Settings from the environment: defaults, parsing, and errors that name the variable."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from model_core.settings import (
    BUNDLED_MODEL_ID,
    ENV_VARS,
    DEFAULT_MAX_TOKENS,
    HARD_MAX_TOKENS,
    Settings,
    load_settings,
)

REPO = Path(__file__).resolve().parent.parent


def test_empty_environment_gives_the_defaults():
    assert load_settings({}) == Settings()


def test_every_documented_default_parses_to_the_same_settings():
    defaults = {name: default for name, (default, _) in ENV_VARS.items()}
    assert load_settings(defaults) == load_settings({})


def test_every_variable_has_a_description():
    assert all(description.strip() for _, description in ENV_VARS.values())


def test_defaults_are_the_bundled_model_auto_device_and_the_hard_limit():
    settings = load_settings({})
    assert (settings.default_model, settings.device, settings.max_tokens) == (BUNDLED_MODEL_ID, "auto", DEFAULT_MAX_TOKENS)
    assert settings.allowed_models == () and settings.allow_local_models is True


def test_reads_os_environ_when_given_nothing(monkeypatch):
    monkeypatch.setenv("AE_MAX_TOKENS", "64")
    assert load_settings().max_tokens == 64


def test_default_model_is_stripped():
    assert load_settings({"AE_DEFAULT_MODEL": "  bert-base-uncased "}).default_model == "bert-base-uncased"


def test_device_is_case_insensitive():
    assert load_settings({"AE_DEVICE": " CUDA "}).device == "cuda"


def test_allowed_models_split_on_commas_and_drop_blanks():
    settings = load_settings({"AE_ALLOWED_MODELS": " bert-base-uncased, ,prajjwal1/bert-tiny,,"})
    assert settings.allowed_models == ("bert-base-uncased", "prajjwal1/bert-tiny")


@pytest.mark.parametrize("raw, expected", [
    ("true", True), ("1", True), ("YES", True), ("on", True),
    ("false", False), ("0", False), ("No", False), ("off", False),
])
def test_allow_local_models_parses_booleans(raw, expected):
    assert load_settings({"AE_ALLOW_LOCAL_MODELS": raw}).allow_local_models is expected


@pytest.mark.parametrize("name", sorted(ENV_VARS))
def test_a_blank_variable_counts_as_unset(name):
    assert load_settings({name: "   "}) == load_settings({})


@pytest.mark.parametrize("name, bad", [
    ("AE_DEVICE", "gpu"),
    ("AE_DEVICE", "tpu"),
    ("AE_MAX_TOKENS", "many"),
    ("AE_MAX_TOKENS", "12.5"),
    ("AE_MAX_TOKENS", "1"),
    ("AE_MAX_TOKENS", "8193"),
    ("AE_FULL_TRACE_MB", "0.001"),
    ("AE_FULL_TRACE_MB", "lots"),
    ("AE_MAX_TOKENS", "-4"),
    ("AE_ALLOW_LOCAL_MODELS", "maybe"),
])
def test_a_bad_value_raises_value_error_naming_the_variable(name, bad):
    with pytest.raises(ValueError, match=name) as info:
        load_settings({name: bad})
    assert repr(bad) in str(info.value) or bad in str(info.value)


@given(st.integers(min_value=2, max_value=HARD_MAX_TOKENS))
def test_any_max_tokens_in_range_round_trips(n):
    assert load_settings({"AE_MAX_TOKENS": str(n)}).max_tokens == n


@given(st.integers().filter(lambda n: not 2 <= n <= HARD_MAX_TOKENS))
def test_any_max_tokens_out_of_range_is_refused(n):
    with pytest.raises(ValueError, match="AE_MAX_TOKENS"):
        load_settings({"AE_MAX_TOKENS": str(n)})


def test_settings_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings().device = "cpu"  # type: ignore[misc]


def test_settings_validate_on_construction():
    with pytest.raises(ValueError, match="AE_DEVICE"):
        Settings(device="gpu")


def test_an_empty_allowlist_allows_any_id():
    assert Settings().is_model_allowed("anyone/any-bert")


def test_an_allowlist_admits_its_ids_the_bundled_model_and_the_default():
    settings = load_settings({"AE_ALLOWED_MODELS": "bert-base-uncased", "AE_DEFAULT_MODEL": "org/default-bert"})
    assert settings.is_model_allowed("bert-base-uncased")
    assert settings.is_model_allowed(BUNDLED_MODEL_ID)
    assert settings.is_model_allowed("org/default-bert")


def test_an_allowlist_refuses_other_ids():
    settings = load_settings({"AE_ALLOWED_MODELS": "bert-base-uncased"})
    assert not settings.is_model_allowed("bert-large-uncased")


# --- the container's start-up check (docker/check_settings.py) ----------------------------------
def _check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "docker" / "check_settings.py")],
                          env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True, timeout=60)


def test_container_start_check_prints_the_settings():
    done = _check({"AE_MAX_TOKENS": "128"})
    assert done.returncode == 0, done.stderr
    assert "max_tokens=128" in done.stdout


def test_container_start_check_refuses_a_bad_variable_by_name():
    done = _check({"AE_DEVICE": "gpu"})
    assert done.returncode == 2
    assert "AE_DEVICE" in done.stderr


def test_the_server_holds_numpys_blas_to_the_threads_it_gives_torch():
    """OpenBLAS starts a thread per core; with a core taken (the browser, another session) its threads spin on
    each other, and the heatmaps page's statistics took 5x longer. ui.loaders holds BLAS to torch's threads."""
    import json
    import os

    code = ("import json, torch, ui.loaders; from threadpoolctl import threadpool_info; "
            "print(json.dumps([torch.get_num_threads(), [i['num_threads'] for i in threadpool_info() "
            "if i['user_api'] == 'blas']]))")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "AE_TORCH_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    torch_threads, blas = json.loads(out.stdout.strip().splitlines()[-1])
    assert torch_threads == 1 and blas and set(blas) == {1}


def test_max_runs_is_a_whole_number_or_auto():
    assert load_settings({"AE_MAX_RUNS": " 3 "}).max_runs == 3
    auto = load_settings({"AE_MAX_RUNS": "auto"}).max_runs
    assert auto == load_settings({}).max_runs == Settings().max_runs and auto in (1, 2)
    assert load_settings({"AE_MAX_RUNS": "auto", "AE_DEVICE": "cpu"}).max_runs == 1  # passes on a CPU share its cores
    with pytest.raises(ValueError, match="AE_MAX_RUNS='two' is not a whole number"):
        load_settings({"AE_MAX_RUNS": "two"})
    with pytest.raises(ValueError, match="AE_MAX_RUNS=0 must be between 1 and 64"):
        load_settings({"AE_MAX_RUNS": "0"})
