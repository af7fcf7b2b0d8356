"""Every CLI verb runs with its model on a (simulated) CUDA GPU, and prints the CPU's numbers.

No GPU is lent to CI, and this project was measured on a real one once, on a subset of its verbs. ``gpu_sim`` stands
in for one: the model's tensors say they are on ``cuda:0``, and any operation that mixes them with a CPU tensor
raises PyTorch's own device error, as a GPU would. So a pass that reads a host array into a model's weights, or a
view of a weight taken before the model moved, fails here as it would fail for a user with a GPU. Both were found
this way: the contribution graph (its sources handed host arrays to the model's weights) and GPT-2's head outputs in
circuits (a transposed weight taken before ``model.to``).

Each verb runs in this process twice, on the CPU and on the simulated GPU, and its JSON (or written file) must be the
same within float tolerance. Both compute with the CPU's kernels, so this checks that the branches a GPU takes (its
default batch, its memory limit, where each step computes) give the CPU's answer; it is not a check of a real GPU's
rounding (on an H200, bfloat16 outputs differed from the CPU's by up to about 6% relative).
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gpu_sim import OnCuda, simulated_cuda
from tiny_models import NUM_LAYERS, build_tiny_decoder

TEXT = "The cat sat on the mat and watched the flies near the window. The dog slept by the door."
PAIR = {"clean": "The cat sat on the mat and the", "corrupt": "The bank sat on the mat and the", "answer": " cat",
        "foil": " bank"}


# -- the simulator itself --------------------------------------------------------------------------------------------
def test_the_simulator_raises_where_a_gpu_would():
    """Mixing devices raises, a CPU scalar mixes, numpy needs a copy first, and a copy is counted."""
    with simulated_cuda() as sim:
        x = torch.ones(3, device="cuda")
        assert isinstance(x, OnCuda) and x.device == torch.device("cuda", 0) and x.is_cuda
        assert (x + 1).device.type == "cuda" and (x * torch.tensor(2.0)).device.type == "cuda"
        with pytest.raises(RuntimeError, match="same device"):
            x + torch.ones(3)
        with pytest.raises(TypeError, match="cuda:0 device type tensor to numpy"):
            x.numpy()
        with pytest.raises(TypeError, match="to numpy"):
            np.asarray(x)
        host = x.cpu()
        assert type(host) is torch.Tensor and host.device.type == "cpu"
        assert (host + torch.ones(3)).tolist() == [2.0, 2.0, 2.0]
        assert x[torch.tensor([0, 2])].device.type == "cuda"  # CPU indices index a CUDA tensor
        x.sum().item()
        assert sim.copies == {"cpu": 1, "item": 1}


@pytest.mark.parametrize("mix", [
    lambda x, c: torch.ones(3)[torch.tensor([0, 1], device="cuda")],  # CUDA indices on a CPU tensor
    lambda x, c: x.__setitem__(torch.tensor([0, 1]), torch.ones(2)),  # CPU values by an index
    lambda x, c: c.__setitem__(torch.tensor([0, 1]), x[:2]),  # CUDA values into a CPU tensor by an index
    lambda x, c: torch.stack([x.sum(), torch.tensor(1.0)]),  # a CPU scalar where only element-wise ops take one
    lambda x, c: x.index_select(0, torch.tensor(0)),
    lambda x, c: torch.tensor(1.0).add_(x.sum()),  # in place on a CPU scalar
])
def test_the_simulator_refuses_what_a_gpu_refuses(mix):
    """Each raised on an H200 (29 Nov); a slice assignment and an element-wise CPU scalar did not."""
    with simulated_cuda():
        x, c = torch.ones(3, device="cuda"), torch.zeros(3)
        x[:2] = torch.ones(2)  # a slice: a copy, allowed
        assert (x * torch.tensor(2.0)).device.type == "cuda" and x[torch.tensor([0])].device.type == "cuda"
        with pytest.raises(RuntimeError, match="same device"):
            mix(x, c)


def test_a_weight_view_taken_before_the_move_stays_on_the_cpu():
    """``model.to("cuda")`` keeps each parameter object (as PyTorch does), but a view of it taken before stays on the
    CPU: the GPT-2 bug this file's docstring names."""
    with simulated_cuda():
        layer = torch.nn.Linear(4, 4)
        weight = layer.weight
        layer.to("cuda")
        assert layer.weight is weight and layer.weight.device.type == "cuda"
        x = torch.ones(2, 4, device="cuda")
        assert layer(x).device.type == "cuda"
        viewed = torch.nn.Linear(4, 4)
        view = viewed.weight.T
        viewed.to("cuda")
        assert viewed(x).device.type == "cuda"
        with pytest.raises(RuntimeError, match="same device"):
            x @ view


# -- every verb --------------------------------------------------------------------------------------------------------
def _run(argv: list[str]) -> str:
    from model_core.cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(argv) == 0, argv
    return out.getvalue()


def _verbs(model: list[str], tmp: Path, decoder: bool) -> dict[str, tuple[list[str], str | None]]:
    """verb name -> (argv, the file it writes or None for its JSON on stdout); {out} is the run's own folder."""
    corpus = tmp / "corpus.txt"
    corpus.write_text("".join(f"{TEXT} Text number {i}.\n" for i in range(3)), encoding="utf-8")
    pairs = tmp / "pairs.jsonl"
    pairs.write_text(json.dumps(PAIR) + "\n", encoding="utf-8")
    verbs = {
        "export": (["export", *model, "--text", TEXT, "--out", "{out}/trace.json"], "trace.json"),
        "graph": (["graph", *model, "--text", TEXT, "--json"], None),
        "roles": (["roles", *model, "--json"], None),
        "composition": (["composition", *model, "--json"], None),
        "qk": (["qk", *model, "--text", TEXT, "--layer", "1", "--head", "0", "--json"], None),
        "atlas": (["atlas", *model, "--corpus", str(corpus), "--out", "{out}/atlas", "--qk-contexts", "2"], "atlas"),
        "corpus": (["corpus", *model, "--input", str(corpus), "--out", "{out}/corpus"], "corpus"),
    }
    if decoder:
        verbs |= {
            "compact": (["export", *model, "--text", TEXT, "--compact", "--out", "{out}/trace.npz"], "trace.npz"),
            "graph-compact": (["graph", *model, "--text", TEXT, "--json"], None),  # AE_FULL_TRACE_MB below
            "attribute": (["attribute", *model, "--text", TEXT, "--json"], None),
            "patch": (["patch", *model, *(f"--{k}={v}" for k, v in PAIR.items()), "--json"], None),
            "patch-dataset": (["patch", *model, "--dataset", str(pairs), "--json"], None),
            "generate": (["generate", *model, "--prompt", "The cat", "--max-new-tokens", "4", "--json"], None),
            "kv": (["kv", *model, "--text", TEXT, "--press", "snapkv", "--compression-ratio", "0.5", "--json"],
                   None),
            "circuit": (["circuit", *model, "--dataset", str(pairs), "--method", "eap-ig", "--steps", "2",
                         "--batch-size", "16", "--json"], None),
        }
    return verbs


def _read(path: Path) -> object:
    """A written file's numbers, or every JSON and NPZ file of a written folder by its relative path."""
    if path.is_dir():
        return {str(f.relative_to(path)): _read(f) for f in sorted(path.rglob("*")) if f.suffix in (".json", ".npz")}
    if path.suffix == ".npz":
        with np.load(path) as z:
            return {k: z[k] for k in z.files}
    return json.loads(path.read_text(encoding="utf-8"))


UNTIMED = {"device", "seconds", "elapsed_s", "created", "started", "finished", "updated", "wall_s", "timings"}
"""Keys whose values differ between runs of the same numbers."""


def _numeric(a: object) -> bool:
    return all(isinstance(v, (int, float, bool)) or v is None for v in np.asarray(a, dtype=object).ravel())


def _same(a: object, b: object, where: str = "") -> None:
    """The same structure and strings (a device's name aside); numbers within float tolerance."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            if k not in UNTIMED:
                _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, np.ndarray) and a.dtype.kind in "fiub":
        np.testing.assert_allclose(a.astype(float), np.asarray(b, dtype=float), rtol=1e-4, atol=1e-6, err_msg=where)
    elif isinstance(a, np.ndarray) and a.ndim == 0:  # a string or an object array of an npz
        _same(a.item(), np.asarray(b).item(), where)
    elif isinstance(a, (list, tuple, np.ndarray)):
        assert len(a) == len(b), where
        if len(a) and _numeric(a) and _numeric(b):
            np.testing.assert_allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float), rtol=1e-4, atol=1e-6,
                                       err_msg=where)
        else:
            for i, (u, v) in enumerate(zip(a, b)):
                _same(u, v, f"{where}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        np.testing.assert_allclose(float(a), float(b), rtol=1e-4, atol=1e-6, err_msg=where)
    elif isinstance(a, str) and isinstance(b, str):
        assert a == b.replace("cuda", "cpu"), where  # "... on cuda" in a description
    else:
        assert a == b, where


def _cpu_and_gpu(model: list[str], tmp: Path, decoder: bool, names: list[str], monkeypatch) -> None:
    monkeypatch.setenv("AE_DTYPE", "auto")  # --dtype sets AE_DTYPE for the process: put back after the test
    for name in names:
        argv, written = _verbs(model, tmp, decoder)[name]
        if name == "graph-compact":
            monkeypatch.setenv("AE_FULL_TRACE_MB", "0.01")  # past a full trace's size: the compact route
        seen = []
        for device in ("cpu", "cuda"):
            out = tmp / f"{name}-{device}"
            out.mkdir()
            run = [a.replace("{out}", str(out)) for a in argv] + ["--device", device]
            with simulated_cuda() if device == "cuda" else contextlib.nullcontext():
                printed = _run(run)
            seen.append(_read(out / written) if written else json.loads(printed) if printed.strip() else None)
        monkeypatch.delenv("AE_FULL_TRACE_MB", raising=False)
        _same(seen[0], seen[1], name)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("simulated")
    return {family: build_tiny_decoder(family, root / family) for family in ("llama", "gpt2")}


DECODER_VERBS = ["export", "compact", "graph", "graph-compact", "attribute", "patch", "patch-dataset", "generate",
                 "kv", "composition", "qk", "circuit", "roles", "corpus", "atlas"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("verb", DECODER_VERBS)
def test_a_llama_verb_runs_on_a_gpu_with_the_cpus_numbers(folders, tmp_path, monkeypatch, verb, dtype):
    """In float32 and in bfloat16 (auto's precision on a GPU over 1B parameters; the CPU's run in bfloat16 too).
    bfloat16 found direct attribution and the atlas refusing every Llama-family model: the norm check's 1e-4 was
    below bfloat16's own rounding."""
    _cpu_and_gpu(["--model", "pretrained", "--model-id", str(folders["llama"]), "--dtype", dtype], tmp_path, True,
                 [verb], monkeypatch)


@pytest.mark.parametrize("verb, dtype", [("graph", "float32"), ("circuit", "float32"), ("patch", "float32"),
                                         ("attribute", "float32"), ("qk", "float32"), ("graph-compact", "bfloat16")])
def test_a_gpt2_verb_runs_on_a_gpu_with_the_cpus_numbers(folders, tmp_path, monkeypatch, verb, dtype):
    """GPT-2's Conv1D weights are read transposed: the views must follow the model to its device. In bfloat16 its
    LayerNorm takes no float32 input (the compact graph's values, recomputed from the residual stream)."""
    _cpu_and_gpu(["--model", "pretrained", "--model-id", str(folders["gpt2"]), "--dtype", dtype], tmp_path, True,
                 [verb], monkeypatch)


OTHER_FAMILIES = ("gemma", "gemma2", "gemma3_text", "mistral", "phi", "phi3", "qwen2", "qwen3")
"""The tiny decoders' other families: each brings its own norms, rotary or head norms to the graph and the splits."""


@pytest.mark.parametrize("verb", ["graph", "graph-compact", "attribute", "qk"])
@pytest.mark.parametrize("family", OTHER_FAMILIES)
def test_every_familys_passes_run_on_a_gpu_in_bfloat16(family_folders, tmp_path, monkeypatch, family, verb):
    """Gemma 2/3's normed attention output, Qwen 3's and Gemma 3's head norms, Phi's partial rotary: the passes
    that read each family's own modules, in bfloat16 on the simulated GPU, against the CPU in bfloat16."""
    _cpu_and_gpu(["--model", "pretrained", "--model-id", str(family_folders(family)), "--dtype", "bfloat16"], tmp_path,
                 True, [verb], monkeypatch)


@pytest.fixture(scope="module")
def family_folders(tmp_path_factory):
    """Each family's tiny decoder, built once for the module when first asked for."""
    root, built = tmp_path_factory.mktemp("simulated-families"), {}

    def folder(family: str) -> Path:
        if family not in built:
            built[family] = build_tiny_decoder(family, root / family)
        return built[family]
    return folder


@pytest.mark.parametrize("model, dtype", [("bert", "float32"), ("custom", "float32"), ("bert", "bfloat16")])
def test_an_encoders_verbs_run_on_a_gpu_with_the_cpus_numbers(tmp_path, monkeypatch, model, dtype):
    """The bundled MiniLM and the chapter-3 encoder (seeded random weights). In bfloat16 BERT's graph raised (its
    post-LayerNorms were handed float32) and its QK split refused (parts summed within 1e-3: below bfloat16's
    rounding)."""
    _cpu_and_gpu(["--model", model, "--dtype", dtype], tmp_path, False, ["export", "graph", "qk", "roles"],
                 monkeypatch)


def test_a_compact_traces_summary_runs_on_the_gpu_with_one_copy_a_layer(folders, tmp_path, monkeypatch):
    """The compact trace summarises each layer where the model is (it read the host's copies before, so a GPU's
    summary ran on the CPU beside it), and brings each layer home in two copies: its queries and keys, its summary."""
    import model_core.compact.build as build

    seen = []
    real = build.summarise_layer

    def spy(q, k, mask, *args, **kwargs):
        seen.append((q.device.type, k.device.type, mask.allowed.device.type))
        return real(q, k, mask, *args, **kwargs)

    monkeypatch.setattr(build, "summarise_layer", spy)
    copies = []
    for repeats in (1, 3):  # about 33 and 100 tokens
        text = " ".join([TEXT] * repeats)
        with simulated_cuda() as sim:
            _run(["export", "--model", "pretrained", "--model-id", str(folders["llama"]), "--text", text, "--compact",
                  "--out", str(tmp_path / f"{repeats}.npz"), "--device", "cuda"])
        copies.append(sum(n for (file, _), n in sim.where.items() if file in ("build.py", "summary.py", "forward.py")))
    assert seen and all(where == ("cuda",) * 3 for where in seen), seen
    # a layer's queries and keys, its summary; the predictions, the mask's check and one more: three times the text too
    assert copies[0] == copies[1] <= 2 * NUM_LAYERS + 3, copies


def test_an_atlas_run_copies_the_gpus_weights_to_the_host_once(folders, tmp_path):
    """The atlas's QK splits read the attention weights on the host: a GPU's are copied once a run, shared by the
    texts (each text's split copied every layer's before: 2.7 GB a text for an 8B model in bfloat16)."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"{TEXT} Text number {i}.\n" for i in range(6)), encoding="utf-8")
    with simulated_cuda() as sim:
        _run(["atlas", "--model", "pretrained", "--model-id", str(folders["llama"]), "--corpus", str(corpus),
              "--out", str(tmp_path / "atlas"), "--qk-contexts", "4", "--device", "cuda"])
    weight_copies = sum(n for (file, _), n in sim.where.items() if file == "frozen.py")
    tensors_a_layer = 5  # W_Q, W_K, W_V, W_O and the norm's gain of the tiny Llama
    assert 0 < weight_copies <= NUM_LAYERS * tensors_a_layer, sim.where
