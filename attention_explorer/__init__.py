"""Attention Explorer in a notebook: ``trace(text)`` runs a model once; the ``Trace`` draws and analyses it.

The figure builders (``attention_explorer.figures``, ``analysis_figures``, ``prediction_figures``) and
bertviz's offline views (``attention_explorer.views``) are the ones the Streamlit app uses. Nothing here
imports streamlit.
"""

from attention_explorer.notebook import Trace, View, head_roles, load, offline_figures, trace, walk
from attention_explorer.generation import GeneratedTrace, generate
from attention_explorer.patching import patch
from attention_explorer.circuits import Circuit, circuit
from attention_explorer.composition import Composition, composition
from attention_explorer.atlas import Atlas, atlas
from attention_explorer.hooks import ActivationCache, hook_points, run_with_cache, run_with_hooks

__all__ = ["ActivationCache", "Atlas", "Circuit", "Composition", "GeneratedTrace", "Trace", "View", "atlas", "circuit",
           "composition", "generate", "head_roles", "hook_points", "load", "offline_figures", "patch", "run_with_cache",
           "run_with_hooks", "trace", "walk"]
