"""`make image-test`: build the unchanged Dockerfile with a real OCI builder (buildah), run the image as
uid 1000 with its own ENTRYPOINT and ENV, and check it the way a user meets it.

Steps, each printed as PASS or FAIL (the exit status is 1 if any failed):

1. base images: the Dockerfile's own (``python:3.11-slim-bookworm``, ``node:22-bookworm-slim``) when Docker
   Hub answers; otherwise local stand-ins built once from Debian bookworm packages (debootstrap; Python
   3.11, Node.js 18) and reused by later runs. The output says which.
2. torch index: the Dockerfile's CPU index when it answers; otherwise a local PEP 503 index on 127.0.0.1
   serving the same CPU wheel of torch (and its dependencies) that pip on this machine installs.
3. build: ``buildah bud --format docker`` (so the HEALTHCHECK is kept) with ``PYTHON_IMAGE``/``NODE_IMAGE``/
   ``TORCH_INDEX_URL`` only where a stand-in is used; the image's size and the build time are printed.
4. config: USER is the uid-1000 user, the HEALTHCHECK is there, the public-deployment ENV is in place.
5. start: ``buildah run --isolation chroot --user 1000:1000`` of the image's ENTRYPOINT with its ENV; the
   server listens on the host's loopback.
6. healthcheck: the image's own HEALTHCHECK command, run inside the container, until it passes (time to
   healthy printed).
7. files: the app's files belong to ``user``, the Hugging Face cache is writable by the process's user, and
   no local state (.venv, .git, node_modules, screenshots) was copied in. The bundled decoder converted at
   build time is a complete model folder under ``AE_MODEL_CACHE`` (config.json, model.safetensors, marker;
   its size printed), and ``ensure_bundled_decoder()`` in the container finds it without converting again.
8. pages: headless Chromium loads every page from the container's port: no exception, no error, no request
   outside the app.
9. bertviz: the head view draws its SVG (require.js, d3 and jQuery came from the node stage's static/vendor).
10. memory: the server's RSS at rest and after a 512-token heatmaps page.
11. preload, only with ``--with-preload``: a second build with ``PRELOAD_MODEL=docker/models/<tiny BERT>`` (a folder
    made here): the container runs offline (``HF_HUB_OFFLINE=1``) with that folder as its default model. CI builds
    once, the image that ships; ``tests/test_deploy.py`` runs the preload step and the app it configures without a
    build (the Dockerfile's ENV for that PRELOAD_MODEL, ``docker/preload_model.py`` on the folder, the app's default).

``--build-only`` runs steps 1-3 and records the image (the commit of a clean tree, the image's id) for a later
``--reuse-build``, which checks that image (steps 4-10) instead of building again, and builds if the record does not
match this commit and this image. CI (``.ci/run``) builds from a clone beside its tests that way.

Containers are removed at the end, whatever happened. Needs root, buildah and debootstrap
(``apt-get install buildah debootstrap``), and Chromium for steps 8-10.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import json
import os
import re
import shutil
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from image_common import (  # noqa: E402
    BUILDAH,
    BUNDLED_DECODER_ID,
    CACHE,
    IMAGE,
    PRELOAD_DIR,
    REAL_BASES,
    ROOT,
    STANDINS,
    TORCH_INDEX,
    Report,
    free_port,
    image_config,
    image_exists,
    sh,
)
from image_container import (  # noqa: E402
    Container,
    check_bertviz,
    check_bundled_decoder,
    check_files,
    check_memory,
    check_pages,
    wait_healthy,
)


# -- 1. base images -------------------------------------------------------------------------------------
def standin_rootfs() -> Path:
    """A debootstrap'ed bookworm (minbase) as a tar, made once and kept in the cache."""
    tar = CACHE / "rootfs" / "rootfs.tar"
    if tar.exists():
        return tar
    folder = CACHE / "rootfs" / "bookworm"
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    sh(["debootstrap", "--variant=minbase", "bookworm", str(folder), "http://deb.debian.org/debian"], check=True)
    sh(["tar", "-C", str(folder), "-cf", str(tar.with_suffix(".tmp")), "."], check=True)
    tar.with_suffix(".tmp").replace(tar)
    shutil.rmtree(folder, ignore_errors=True)
    return tar


def base_images(report: Report) -> dict[str, str]:
    """Build arguments for the base images: none when the real ones pull, stand-ins otherwise."""
    pulled = all(sh([*BUILDAH, "pull", "--quiet", image], timeout=120).returncode == 0 for image in REAL_BASES.values())
    if pulled:
        report.step("base images", True, "pulled the Dockerfile's own " + ", ".join(REAL_BASES.values()))
        return {}
    report.note("Docker Hub cannot be reached: building with LOCAL STAND-INS for the base images, made from "
                "Debian bookworm packages (python3 3.11 + venv + pip; nodejs 18 + npm), not the official images.")
    args, built = {}, []
    for arg, (name, containerfile) in STANDINS.items():
        args[arg] = name
        if image_exists(name):
            continue
        context = CACHE / "standin-context"
        context.mkdir(parents=True, exist_ok=True)
        shutil.copy(standin_rootfs(), context / "rootfs.tar")
        ca = Path("/etc/ssl/certs/ca-certificates.crt")
        (context / "host-ca.crt").write_bytes(ca.read_bytes() if ca.exists() else b"")
        sh([*BUILDAH, "bud", "--isolation", "chroot", "--format", "docker", "-f",
            str(ROOT / "scripts" / "image" / containerfile), "-t", name, str(context)], check=True)
        built.append(name)
    report.step("base images", True, ("built " + ", ".join(built) if built else "reused")
                + " (stand-ins: " + ", ".join(args.values()) + ")")
    return args


# -- 2. torch index -------------------------------------------------------------------------------------
def reachable(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=8):
            return True
    except OSError:
        return False


def torch_pin() -> str:
    return re.search(r"^torch==(\S+)", (ROOT / "requirements.txt").read_text(), re.M).group(1)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # the build's own log says what it fetched
        pass


def local_torch_index(report: Report, stack: contextlib.ExitStack) -> dict[str, str]:
    """Serve torch's CPU wheel and its dependencies as a PEP 503 index on 127.0.0.1 (for the build's RUN)."""
    if reachable(TORCH_INDEX + "/torch/"):
        report.step("torch index", True, f"the Dockerfile's default {TORCH_INDEX}")
        return {}
    wheels, simple = CACHE / "torch-wheels", CACHE / "torch-index"
    sh([sys.executable, "-m", "pip", "download", "--quiet", f"torch=={torch_pin()}", "--dest", str(wheels),
        "--python-version", "3.11", "--only-binary=:all:"], check=True)
    shutil.rmtree(simple, ignore_errors=True)
    for wheel in wheels.glob("*.whl"):
        project = re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
        (simple / project).mkdir(parents=True, exist_ok=True)
        shutil.copy(wheel, simple / project / wheel.name)
    for folder in simple.iterdir():
        links = "".join(f'<a href="{w.name.replace("+", "%2B")}">{w.name}</a>\n' for w in folder.glob("*.whl"))
        (folder / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    port = free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), functools.partial(_QuietHandler, directory=str(simple)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stack.callback(server.shutdown)
    report.note(f"{TORCH_INDEX} cannot be reached: TORCH_INDEX_URL points at a local index of the same CPU wheel "
                f"(torch {torch_pin()}, from this machine's pip) on 127.0.0.1:{port}.")
    report.step("torch index", True, f"local, {len(list(simple.iterdir()))} projects")
    return {"TORCH_INDEX_URL": f"http://127.0.0.1:{port}/"}


# -- 3-4. build and config ----------------------------------------------------------------------------
STORAGE = Path("/var/lib/containers")
"""Where buildah keeps its images, run as root (vfs: every layer a whole copy of the tree)."""


def build(report: Report, args: dict[str, str], tag: str, label: str) -> bool:
    cmd = [*BUILDAH, "bud", "--isolation", "chroot", "--format", "docker", "-t", tag]
    for key, value in args.items():
        cmd += ["--build-arg", f"{key}={value}"]
    start = time.perf_counter()
    result = sh([*cmd, str(ROOT)], timeout=3600)
    seconds = time.perf_counter() - start
    # The image this tag named before, and the build's own stages, are left untagged: each held 3 GB of vfs storage,
    # and a day's builds filled the disk (29 Nov: 17 of them, 50 GB, until a commit failed for want of space).
    sh([*BUILDAH, "rmi", "--prune"])
    if result.returncode != 0:
        free = shutil.disk_usage(STORAGE if STORAGE.exists() else "/").free / 2**30
        return report.step(label, False, f"buildah bud exited {result.returncode} ({free:.1f} GB free for its "
                                         f"storage):\n{result.stderr[-4000:]}")
    size = sh([*BUILDAH, "images", "--format", "{{.Size}}", tag]).stdout.strip()
    report.figures[f"{label} s"] = round(seconds, 1)
    report.figures[f"{label} image size"] = size
    return report.step(label, True, f"{seconds:.0f} s, image {size}")


# -- a build made ahead (--build-only), used by a later run (--reuse-build) --------------------------------------
BUILT = CACHE / "built.json"
"""What ``--build-only`` built: the commit of a clean tree, the image's id, the build's seconds and size."""


def clean_commit() -> str | None:
    """HEAD's commit if no tracked file differs from it, else None (a build of a changed tree is never reused)."""
    head = sh(["git", "-C", str(ROOT), "rev-parse", "HEAD"])
    dirty = sh(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"])
    if head.returncode != 0 or dirty.returncode != 0 or dirty.stdout.strip():
        return None
    return head.stdout.strip()


def image_id(tag: str) -> str:
    return sh([*BUILDAH, "images", "--no-trunc", "--format", "{{.ID}}", tag]).stdout.strip()


def record_build(report: Report) -> None:
    commit = clean_commit()
    if commit is None:
        BUILT.unlink(missing_ok=True)
        return
    BUILT.write_text(json.dumps({"commit": commit, "image": image_id(IMAGE), "seconds": report.figures["build s"],
                                 "size": report.figures["build image size"]}))


def reuse_build(report: Report) -> bool:
    """Take the image ``--build-only`` made of this commit, if the tree is clean and the image is still that one."""
    try:
        built = json.loads(BUILT.read_text())
    except (OSError, ValueError):
        return False
    commit = clean_commit()
    if commit is None or built.get("commit") != commit or not image_exists(IMAGE) or image_id(IMAGE) != built["image"]:
        report.note("no image built ahead from this commit: building now")
        return False
    report.figures["build s"] = built["seconds"]
    report.figures["build image size"] = built["size"]
    return report.step("build", True, f"reused the image built ahead from {commit[:10]} (its build took "
                                      f"{built['seconds']:.0f} s): image {built['size']}")


def check_config(report: Report, config: dict) -> None:
    env = dict(e.split("=", 1) for e in config.get("Env", []))
    problems = []
    if config.get("User") in (None, "", "root", "0"):
        problems.append(f"USER is {config.get('User')!r}")
    if not (config.get("Healthcheck") or {}).get("Test"):
        problems.append("no HEALTHCHECK (was the image built with --format docker?)")
    if env.get("AE_ALLOW_LOCAL_MODELS") != "false" or not env.get("AE_ALLOWED_MODELS"):
        problems.append("public-deployment ENV missing")
    if env.get("HOME") != "/home/user" or not env.get("HF_HOME", "").startswith("/home/user/"):
        problems.append(f"HOME/HF_HOME are {env.get('HOME')}/{env.get('HF_HOME')}")
    if not env.get("AE_MODEL_CACHE", "").startswith("/home/user/"):
        problems.append(f"AE_MODEL_CACHE is {env.get('AE_MODEL_CACHE')!r}, not a folder of the user's")
    if BUNDLED_DECODER_ID not in env.get("AE_ALLOWED_MODELS", "").split(","):
        problems.append(f"AE_ALLOWED_MODELS lacks {BUNDLED_DECODER_ID}")
    report.step("config", not problems, "; ".join(problems) or
                f"USER {config['User']}, HEALTHCHECK {config['Healthcheck']['Test'][0]}, "
                f"ENTRYPOINT {config.get('Entrypoint')}")


# -- 11. a preloaded folder model -------------------------------------------------------------------------
def check_preload(report: Report, args: dict[str, str], browser) -> None:
    from harness.browser import wait_for_run
    from harness.models import make_tiny_bert

    folder = ROOT / PRELOAD_DIR
    make_tiny_bert(folder)
    try:
        if not build(report, {**args, "PRELOAD_MODEL": PRELOAD_DIR}, IMAGE + "-preload", "build with PRELOAD_MODEL"):
            return
        box = Container(IMAGE + "-preload", "ae-image-test-preload", {})
        try:
            if not wait_healthy(report, box):
                return
            env = box.run("/bin/sh", "-c", "echo $HF_HUB_OFFLINE $AE_DEFAULT_MODEL").stdout.split()
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(box.url, wait_until="domcontentloaded")
            wait_for_run(page, 300)
            caption = page.locator('section[data-testid="stSidebar"]').inner_text()
            page.close()
            ok = env == ["1", PRELOAD_DIR] and PRELOAD_DIR in caption and "2 layers x 2 heads" in caption
            report.step("preloaded folder is the offline default", ok,
                        f"HF_HUB_OFFLINE={env[0] if env else '?'}, AE_DEFAULT_MODEL={env[1] if len(env) > 1 else '?'}, "
                        f"the sidebar names it: {PRELOAD_DIR in caption}")
        finally:
            box.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        sh([*BUILDAH, "rmi", IMAGE + "-preload"])


def main() -> int:
    parser = argparse.ArgumentParser(description="Build the Dockerfile with buildah and check the running image.")
    parser.add_argument("--with-preload", action="store_true",
                        help="also step 11, a second build with PRELOAD_MODEL (about 3-6 min); CI builds the one "
                             "image that ships, and tests/test_deploy.py checks the preload step without a build")
    parser.add_argument("--build-only", action="store_true",
                        help="steps 1-3 only: build the image and record it for a later --reuse-build (CI builds "
                             "beside its tests: .ci/run)")
    parser.add_argument("--reuse-build", action="store_true",
                        help="use the image a --build-only run made of this same commit, the tree clean; build it "
                             "if there is none")
    args = parser.parse_args()
    report = Report()
    if os.geteuid() != 0 or shutil.which("buildah") is None:
        report.step("buildah", False, "needs root and buildah: apt-get install buildah debootstrap")
        return 1
    CACHE.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        reused = args.reuse_build and not args.with_preload and reuse_build(report)
        build_args: dict[str, str] = {}
        if not reused:
            build_args = base_images(report)
            build_args |= local_torch_index(report, stack)
            if not build(report, build_args, IMAGE, "build"):
                BUILT.unlink(missing_ok=True)
                return 1
            record_build(report)
        if args.build_only:
            print(json.dumps({"figures": report.figures, "total_s": round(time.perf_counter() - started, 1)}))
            return 0
        check_config(report, image_config(IMAGE))
        box = Container(IMAGE, "ae-image-test", {})
        stack.callback(box.stop)
        if wait_healthy(report, box):
            check_files(report, box)
            check_bundled_decoder(report, box)
            from harness.browser import CHROMIUM, chromium

            if not CHROMIUM.exists():
                report.step("browser", False, "Chromium is missing: apt-get install chromium")
            else:
                for browser in chromium():
                    check_memory(report, box, browser)  # first: "at rest" is right after the start
                    check_pages(report, box, browser)
                    check_bertviz(report, box, browser)
                    box.stop()
                    if args.with_preload:
                        check_preload(report, build_args, browser)
    print(json.dumps({"figures": report.figures, "total_s": round(time.perf_counter() - started, 1)}), flush=True)
    if report.failed:
        print(f"FAILED: {', '.join(report.failed)}")
        return 1
    print("image-test: every step passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
