"""What the image test's steps share: the paths and names, the PASS/FAIL report, running a command, and
reading an image's config (``scripts/image_test.py`` runs the steps)."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BUILDAH = ["buildah", "--storage-driver", "vfs"]
CACHE = Path(os.environ.get("AE_IMAGE_TEST_CACHE", "~/.cache/attention-explorer/image-test")).expanduser()
REAL_BASES = {"PYTHON_IMAGE": "docker.io/library/python:3.11-slim-bookworm",
              "NODE_IMAGE": "docker.io/library/node:22-bookworm-slim"}
STANDINS = {"PYTHON_IMAGE": ("localhost/ae-standin-python:bookworm", "standin-python.Containerfile"),
            "NODE_IMAGE": ("localhost/ae-standin-node:bookworm", "standin-node.Containerfile")}
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
BUNDLED_DECODER_ID, BUNDLED_DECODER_DIR = "bundled:SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct"  # model_core/models/bundled.py
IMAGE = "localhost/attention-explorer:image-test"
PRELOAD_DIR = "docker/models/ae-image-test-tiny-bert"
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}
LONG_TEXT = " ".join(("the quick brown fox jumps over the lazy dog while a small bird sings in the old tree near "
                      "the river and children play").split() * 40)


class Report:
    """PASS/FAIL lines, as they happen."""

    def __init__(self) -> None:
        self.failed: list[str] = []
        self.figures: dict[str, object] = {}

    def step(self, name: str, ok: bool, detail: str = "") -> bool:
        print(f"{'PASS' if ok else 'FAIL'}  {name}" + (f": {detail}" if detail else ""), flush=True)
        if not ok:
            self.failed.append(name)
        return ok

    def note(self, text: str) -> None:
        print(f"NOTE  {text}", flush=True)


def sh(args: list[str], *, timeout: float = 3600, check: bool = False, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:6])}… exited {result.returncode}:\n{result.stderr[-3000:]}")
    return result


def image_exists(name: str) -> bool:
    return sh([*BUILDAH, "inspect", "--type", "image", name]).returncode == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]



def image_config(name: str) -> dict:
    data = json.loads(sh([*BUILDAH, "inspect", "--type", "image", name], check=True).stdout)
    return data["Docker"]["config"]
