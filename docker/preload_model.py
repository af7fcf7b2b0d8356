"""Download a hub model into the Hugging Face cache at image build time, then prove it loads offline.

Usage: ``python docker/preload_model.py MODEL_ID``; an empty MODEL_ID does nothing, so the
Dockerfile can run it unconditionally.
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


def main(argv: list[str]) -> int:
    model_id = argv[1].strip() if len(argv) > 1 else ""
    if not model_id:
        print("PRELOAD_MODEL is empty: no model preloaded (the bundled MiniLM needs no download).")
        return 0
    preload(model_id)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
