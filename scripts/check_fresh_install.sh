#!/usr/bin/env bash
# `pip install .` into a fresh virtual environment (CPU torch first), then the notebook API with no
# Streamlit installed. Needs the package index (PyPI); takes a few minutes. Usage: scripts/check_fresh_install.sh
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(mktemp -d)/venv
python3 -m venv "$venv"
# torch first and alone: a bare `torch` requirement would pull several GB of CUDA wheels.
"$venv/bin/pip" install --quiet torch==2.13.0
"$venv/bin/pip" install --quiet -c requirements.txt .
cd "$(dirname "$venv")"  # away from the checkout, so the installed package is the one imported
"$venv/bin/python" - <<'PY'
import importlib.util, sys
assert importlib.util.find_spec("streamlit") is None, "streamlit was installed without the [app] extra"
import model_core, attention_explorer as ae
t = ae.trace("The cat sat on the mat.", "It was tired.")
fig, view = t.heatmap(1, 2), t.head_view()
assert "<script src=" not in view.html and len(t.to_pandas()) > 0
print(f"ok: {ae.__file__}; {t}; head view {len(view.html) / 1e3:.0f} kB, no streamlit")
PY
"$venv/bin/attention-explorer" models | head -2
rm -rf "$(dirname "$venv")"
