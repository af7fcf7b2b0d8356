"""No module outside ``model_core/families/`` names a model's modules (``o_proj``, ``c_proj``, ``model.transformer.h``)
or asks its ``model_type``: the family adapters say where each part is (``Family.parts``, ``Family.embed_parts``) and
what a page should say about it (issue 42). This test reads the source (ast) of ``model_core/`` (but ``families/``),
``ui/``, ``pages/`` and ``attention_explorer/`` and fails on:

- an attribute named after a model's module (``.self_attn``, ``.c_proj``, ``.post_feedforward_layernorm``...), or a
  chain that walks a model's layout (``.transformer.h``, ``.encoder.layer``, ``model.model``);
- a string, other than a docstring, naming such a module (``getattr(attn, "o_proj")``) or a model's own class
  (``"PhiDecoderLayer"``);
- a comparison that asks a ``model_type`` (``config.model_type == "gemma2"``, ``.startswith("gemma")``), or that
  compares anything with a model type or family name (``family.name == "gpt2"``).

``o_proj``, ``q_norm`` and ``k_norm`` are also fields of ``BlockParts``: as attributes they pass when read from a
``...parts`` value (``parts.o_proj``). The allow-list below says why each remaining place may name a family.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from model_core.families import FAMILIES, SUPPORTED_MODEL_TYPES

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("model_core", "ui", "pages", "attention_explorer")
FAMILIES_DIR = "model_core/families/"

MODULE_NAMES = frozenset({
    # Llama-like decoders (Llama, Qwen, Mistral, Gemma, Phi)
    "self_attn", "q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "gate_proj", "up_proj", "down_proj", "act_fn",
    "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm",
    "final_layernorm", "embed_tokens", "embed_scale", "variance_epsilon", "q_norm", "k_norm", "v_norm",
    # GPT-2
    "c_attn", "c_proj", "c_fc", "ln_1", "ln_2", "ln_f", "wte", "wpe",
    # BERT (its ``LayerNorm`` attribute is checked apart: ``torch.nn.LayerNorm`` is no model's module)
    "dense", "intermediate", "word_embeddings",
    # the chapter-3 encoder
    "output_linear", "layer_norm_1", "layer_norm_2", "feed_forward", "linear_1", "linear_2",
})
"""Attribute names of a model's modules, in the families the app reads."""

PARTS_FIELDS = frozenset({"o_proj", "q_norm", "k_norm"})
"""Module names that are also ``BlockParts`` fields: an attribute read from a ``...parts`` value passes."""

CHAINS = frozenset({("transformer", "h"), ("encoder", "layer"), ("encoder", "layers"), ("encoder", "embeddings"),
                    ("model", "model"), ("model", "layers"), ("attention", "self"), ("attention", "output")})
"""``a.b`` pairs that walk a model's layout (GPT-2's ``transformer.h``, BERT's ``encoder.layer``, a Llama's
``model.model.layers``)."""

IDENTIFIER_LIKE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
"""A string that could name an attribute or a module path (``"o_proj"``, ``"model.layers.0.self_attn"``); a string
with spaces is text for people, which may name a module to explain it."""

CLASS_NAME = re.compile(r"\b[A-Z][A-Za-z0-9]*(?:DecoderLayer|EncoderLayer|Attention|RMSNorm|MLP|Block)\b")
"""A model's own class names (``PhiDecoderLayer``, ``GemmaRMSNorm``), which ``type(m).__name__`` tests compare."""

FAMILY_WORDS = frozenset(SUPPORTED_MODEL_TYPES) | {name for name in FAMILIES if name != "custom"}
"""Model types and family names. "custom" is left out: it is also the user's choice of the chapter-3 encoder
(``TraceRequest.model``), not a question about a loaded model."""

ALLOWED: dict[tuple[str, str], str] = {
    ("model_core/chapter3/model.py", "*"):
        "the chapter-3 encoder's own definition: it builds and names its own modules.",
    ("model_core/chapter3/from_bert.py", "*"):
        "copies a BERT checkpoint's weights into the chapter-3 encoder: a converter names both models' modules.",
    ("model_core/models/custom.py", "bert"):
        "only a BERT checkpoint has weights the chapter-3 encoder can take, so its builder checks for one.",
    ("model_core/trace/request.py", "bert"):
        '"bert" is the old name of the pretrained-model choice in saved links and scripts, not a family.',
    ("model_core/corpus/model.py", "bert"):
        '"bert" is the old name of the pretrained-model choice in older run folders, not a family.',
}
"""(file, the name it may use, or "*" for any) -> why."""


def _last_name(node: ast.AST) -> str:
    """The last identifier of an expression (``a.b[0].parts`` -> "parts"), or ""."""
    while isinstance(node, (ast.Subscript, ast.Call)):
        node = node.value if isinstance(node, ast.Subscript) else node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _mentions_model_type(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr == "model_type":
            return True
        if isinstance(sub, ast.Name) and sub.id == "model_type":
            return True
        if isinstance(sub, ast.Constant) and sub.value == "model_type":
            return True
    return False


def _family_word(node: ast.AST) -> bool:
    """A string constant that is a model type or family name, in any case ("gpt2", "Gemma")."""
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.lower() in FAMILY_WORDS


def _family_prefix(node: ast.AST) -> bool:
    """A string constant of three letters or more that begins a model type or family name ("gemma", "Qwen")."""
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) >= 3):
        return False
    return any(word.startswith(node.value.lower()) for word in FAMILY_WORDS)


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are statements of their own (docstrings, bare strings)."""
    return {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}


def scan_source(source: str) -> list[tuple[int, str, str]]:
    """The places in one module's source that name a model's modules or ask a model type: (line, name, what)."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    found: list[tuple[int, str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if node.attr in MODULE_NAMES and not (node.attr in PARTS_FIELDS and "parts" in _last_name(node.value)):
                found.append((node.lineno, node.attr, f"attribute .{node.attr}"))
            if node.attr == "LayerNorm" and _last_name(node.value) != "nn":  # BERT's, not torch.nn's
                found.append((node.lineno, node.attr, "attribute .LayerNorm"))
            if (_last_name(node.value), node.attr) in CHAINS:
                found.append((node.lineno, node.attr, f"layout .{_last_name(node.value)}.{node.attr}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            looks_like_a_name = IDENTIFIER_LIKE.match(node.value) is not None
            words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", node.value)) if looks_like_a_name else set()
            for word in words & MODULE_NAMES:
                found.append((node.lineno, word, f"string naming {word!r}"))
            for match in CLASS_NAME.finditer(node.value):
                found.append((node.lineno, match.group(0), f"string naming the class {match.group(0)!r}"))
        elif isinstance(node, ast.Compare):
            if _mentions_model_type(node):
                found.append((node.lineno, "model_type", "a comparison asking a model_type"))
            for word in {sub.value for sub in ast.walk(node) if _family_word(sub)}:
                found.append((node.lineno, word, f"a comparison with the family or model type {word!r}"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("startswith", "endswith")):
            if _mentions_model_type(node.func.value):
                found.append((node.lineno, "model_type", f"model_type.{node.func.attr}(...)"))
            for arg in node.args:
                if _family_prefix(arg):
                    found.append((node.lineno, arg.value, f".{node.func.attr}({arg.value!r}), a family's name"))
    return found


def _scanned_files() -> list[Path]:
    files = []
    for top in SCANNED:
        files += [p for p in sorted((ROOT / top).rglob("*.py")) if "__pycache__" not in p.parts]
    return [p for p in files if not p.relative_to(ROOT).as_posix().startswith(FAMILIES_DIR)]


def scan_tree() -> tuple[list[str], set[tuple[str, str]]]:
    """Every place outside ``families/`` that names a model's modules or asks a model type, less the allow-list;
    and the allowances that let a place pass."""
    out, used = [], set()
    for path in _scanned_files():
        rel = path.relative_to(ROOT).as_posix()
        for line, name, what in scan_source(path.read_text(encoding="utf-8")):
            allowance = next((key for key in ((rel, "*"), (rel, name)) if key in ALLOWED), None)
            if allowance is None:
                out.append(f"{rel}:{line}: {what}")
            else:
                used.add(allowance)
    return out, used


def test_no_module_outside_families_names_a_models_parts():
    found, _ = scan_tree()
    assert not found, ("Family knowledge outside model_core/families/ (ask the adapter: Family.parts, "
                       "Family.embed_parts, or a flag it sets):\n" + "\n".join(found))


def test_every_allowance_is_still_needed():
    _, used = scan_tree()
    assert set(ALLOWED) - used == set(), "remove these allowances: nothing needs them any more"


MODULE_HOOKS = re.compile(r"\.register_(?:forward_pre_hook|forward_hook|full_backward_hook|full_backward_pre_hook)\(")


def test_no_module_outside_families_hooks_the_model_itself():
    """One way into the model: a read or a write inside a pass goes through the hook layer (``HookRun``), whose
    module hooks ``families/`` installs; a file that registers its own would be a second mechanism."""
    found = [f"{p.relative_to(ROOT).as_posix()}:{i}" for p in _scanned_files()
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if MODULE_HOOKS.search(line)]
    assert not found, "register hooks through model_core.families.hooks (a HookRun's points or steps):\n" + \
        "\n".join(found)
    assert MODULE_HOOKS.search("handle = block.register_forward_pre_hook(enter, with_kwargs=True)")  # it can fail


def test_the_scan_reads_every_package():
    rels = {p.relative_to(ROOT).as_posix() for p in _scanned_files()}
    for expected in ("model_core/effects/blocks.py", "ui/inside_decoder.py", "model_core/walk/decoder.py"):
        assert expected in rels
    assert not any(r.startswith(FAMILIES_DIR) for r in rels)
    assert any(r.startswith("pages/") for r in rels) and any(r.startswith("attention_explorer/") for r in rels)


PLANTED = '''
def f(model, family, config, block, attn, wt):
    a = block.self_attn
    b = getattr(attn, "c_proj", None)
    c = model.transformer.h[0]
    d = model.model.layers
    if config.model_type == "gemma2":
        pass
    if wt.model_type.startswith("gemma"):
        pass
    if family.name == "gpt2":
        pass
    if type(block).__name__ == "PhiDecoderLayer":
        pass
    e = model.encoder.layer[0].attention.output.dense
    g = attn.o_proj
    h = type(block).__name__.startswith("Gemma")
    i = block.attention.output.LayerNorm
'''


def test_the_scan_finds_planted_violations():
    found = scan_source(PLANTED)
    whats = "\n".join(what for _, _, what in found)
    lines = {line for line, _, _ in found}
    assert "attribute .self_attn" in whats
    assert "string naming 'c_proj'" in whats
    assert "layout .transformer.h" in whats
    assert "layout .model.model" in whats and "layout .model.layers" in whats
    assert "a comparison asking a model_type" in whats
    assert "model_type.startswith(...)" in whats
    assert "a comparison with the family or model type 'gpt2'" in whats
    assert "string naming the class 'PhiDecoderLayer'" in whats
    assert "layout .encoder.layer" in whats and "attribute .dense" in whats
    assert "attribute .o_proj" in whats  # o_proj read from a module, not from a BlockParts
    assert ".startswith('Gemma'), a family's name" in whats and "attribute .LayerNorm" in whats
    assert lines >= {3, 4, 5, 6, 7, 9, 11, 13, 15, 16, 17, 18}


CLEAN = '''
"""A docstring may say o_proj, c_proj and model.transformer.h: it explains, it does not reach in."""


def f(family, model, layer, trace):
    """Read the output projection (``o_proj``) through the adapter."""
    parts = family.parts(model, layer)
    w = parts.o_proj.weight
    norm = parts.q_norm if isinstance(parts.ln1, torch.nn.LayerNorm) else None
    label = "the Gemma RMSNorm scales by (1 + w)"
    if trace.model_kind == "custom" or parts.attn_post_norm is not None:
        return w
    return f"A {family.label} has no {trace.n_layers} layers"  # a comment may say self_attn too
'''


def test_the_scan_passes_code_that_asks_the_adapter():
    assert scan_source(CLEAN) == []
