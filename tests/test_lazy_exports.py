"""The package's public names load on first use (model_core.lazy): the command line's parser needs no torch, and
every public name still imports from model_core and model_core.corpus as it did."""

import importlib
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_command_lines_parser_imports_neither_torch_nor_transformers():
    code = ("import sys, model_core, model_core.cli.main as cli; cli.build_parser(); "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_help_lists_every_verb():
    out = subprocess.run([sys.executable, "-m", "model_core", "--help"], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    from model_core.cli.main import VERBS

    assert all(verb in out.stdout for verb in VERBS)


@pytest.mark.parametrize("package", ["model_core", "model_core.corpus"])
def test_every_public_name_is_its_home_modules_object(package):
    module = importlib.import_module(package)
    homes = module._HOMES
    assert sorted(module.__all__) == sorted(homes)
    for name, home in homes.items():
        assert getattr(module, name) is getattr(importlib.import_module(home), name), name
        assert name in dir(module)


def test_an_unknown_name_is_an_attribute_error_and_a_subpackage_is_reachable():
    import model_core

    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        model_core.no_such_name  # noqa: B018
    assert model_core.families.FAMILIES is model_core.FAMILIES
    namespace: dict = {}
    exec("from model_core import *", namespace)
    assert "TraceRequest" in namespace and "build_trace" in namespace
