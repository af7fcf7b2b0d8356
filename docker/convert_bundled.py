"""Convert the bundled decoder (SmolLM2-135M-Instruct) into ``$AE_MODEL_CACHE`` at image build time, and check it.

Usage: ``python docker/convert_bundled.py``. Loads ``model_core/models/bundled.py`` by file path, not through the
package, so the Dockerfile can run it in a layer of its own before the rest of the code is copied: a code
change does not redo the conversion. The check then loads the folder offline, as the app will.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

BUNDLED_FILE = Path(__file__).resolve().parent.parent / "model_core" / "models" / "bundled.py"

# In a child process with HF_HUB_OFFLINE=1 (huggingface_hub reads it once, at import): the folder alone must do.
OFFLINE_CHECK = (
    "import sys, torch\n"
    "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
    "tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])\n"
    "model = AutoModelForCausalLM.from_pretrained(sys.argv[1], attn_implementation='eager').eval()\n"
    "c = model.config\n"
    "assert (c.model_type, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) == ('llama', 30, 9, 3), c\n"
    "ids = tokenizer('The capital of France is', return_tensors='pt').input_ids\n"
    "with torch.no_grad():\n"
    "    word = tokenizer.decode(model(ids).logits[0, -1].argmax())\n"
    "assert word == ' Paris', word\n"
)


def load_bundled_module():
    """``model_core/models/bundled.py`` as a stand-alone module (it imports nothing from the package at import time)."""
    spec = importlib.util.spec_from_file_location("_ae_bundled", BUNDLED_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main() -> int:
    bundled = load_bundled_module()
    started = time.perf_counter()
    folder = bundled.ensure_bundled_decoder(lambda message: print(message, flush=True))
    seconds = time.perf_counter() - started
    size = sum(path.stat().st_size for path in folder.iterdir())
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, "-c", OFFLINE_CHECK, str(folder)], env=env, check=True)
    print(f"{bundled.BUNDLED_DECODER_ID}: {folder} ({size / 1e6:.0f} MB, {seconds:.0f} s) loads offline and "
          "predicts ' Paris' after 'The capital of France is'.", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
