"""Architecture: model_core never imports streamlit or IPython."""

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_model_core_source_has_no_ui_imports():
    offenders = []
    for path in (ROOT / "model_core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in ("streamlit", "IPython", "bertviz")]
    assert not offenders, offenders


def test_importing_model_core_loads_no_streamlit():
    code = "import sys, model_core, model_core.io.export, model_core.trace.request; " \
           "print(sorted(m for m in sys.modules if m.split('.')[0] in ('streamlit', 'IPython')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
