"""Architecture: model_core never imports streamlit or IPython; its root keeps only what everything shares; no
file grows past 400 lines."""

import ast
import os
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
    code = "import sys, model_core, model_core.io.export, model_core.trace.request, model_core.cli.main; " \
           "print(sorted(m for m in sys.modules if m.split('.')[0] in ('streamlit', 'IPython')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


SKIPPED_DIRS = {".venv", "node_modules", ".git", "build", "dist", "__pycache__"}
MAX_LINES = 400
MAX_ROOT_MODULES = 8


def test_model_core_root_keeps_only_what_everything_shares():
    root = sorted(p.name for p in (ROOT / "model_core").glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, f"{len(root)} modules in model_core/ (at most {MAX_ROOT_MODULES}): " \
                                          f"{root}; move each into the subpackage of its job"


def test_no_python_file_is_over_400_lines():
    long = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS]  # not into the virtual environment
        for name in files:
            path = pathlib.Path(folder, name)
            lines = len(path.read_text(encoding="utf-8").splitlines()) if name.endswith(".py") else 0
            if lines > MAX_LINES:
                long.append(f"{path.relative_to(ROOT)}: {lines}")
    assert not long, f"over {MAX_LINES} lines (a file that does two jobs becomes two files): {long}"
