"""The app's torch threads: half the cores for passes (``cpu_threads``), every core while a reply is generated."""

from __future__ import annotations

import pytest
import torch

from ui import loaders


@pytest.fixture
def two_cores(monkeypatch):
    """A 2-core machine whose server keeps 1 thread, with no thread setting in the environment."""
    for name in ("AE_TORCH_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(loaders.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(loaders, "CPU_THREADS", 1)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_cpu_threads_is_half_the_cores_unless_set(monkeypatch):
    for name in ("AE_TORCH_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(loaders.os, "cpu_count", lambda: 8)
    assert loaders.cpu_threads() == 4
    monkeypatch.setenv("AE_TORCH_THREADS", "3")
    assert loaders.cpu_threads() == 3


def test_a_generation_gets_every_core_and_gives_them_back(two_cores):
    with loaders.all_cores_for_generation():
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == 1


def test_a_generation_stopped_by_an_exception_gives_the_cores_back(two_cores):
    with pytest.raises(RuntimeError), loaders.all_cores_for_generation():
        raise RuntimeError("Stop pressed")
    assert torch.get_num_threads() == 1


def test_a_thread_setting_is_kept(two_cores, monkeypatch):
    monkeypatch.setenv("AE_TORCH_THREADS", "1")
    with loaders.all_cores_for_generation():
        assert torch.get_num_threads() == 1
