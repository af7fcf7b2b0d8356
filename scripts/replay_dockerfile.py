"""Replay the Dockerfile without a Docker engine, then check the app it would serve.

Reads ``Dockerfile`` itself (FROM, ARG, ENV, WORKDIR, COPY, RUN, USER, EXPOSE, HEALTHCHECK,
ENTRYPOINT, CMD), maps the image's paths (``/opt/venv``, ``/home/user/app``, ...) onto a temporary
directory, runs the same RUN commands there (so ``python -m venv /opt/venv`` makes a fresh virtual
environment), starts the app with the Dockerfile's own ENTRYPOINT and PORT, waits until the
Dockerfile's own HEALTHCHECK passes, loads the page in headless Chromium and checks it rendered.

What cannot be replayed is said out loud, never hidden:
  * base images are the host's interpreters (``python`` for a python:* image, ``node``/``npm``
    for a node:* image);
  * root-only RUN steps (``useradd``, ``apt-get`` ...) are skipped and USER is not switched;
  * a pip ``--index-url`` that is unreachable from here (the PyTorch wheel index) is dropped, so pip
    falls back to the indexes configured on this machine (PyPI and its local wheels);
  * ``PIP_NO_CACHE_DIR`` is ignored so that a second replay can reuse pip's cache.

Usage (a fresh install takes minutes; ``--reuse-venv .venv --offline`` is the quick mode the
test suite runs):
    .venv/bin/python scripts/replay_dockerfile.py
    .venv/bin/python scripts/replay_dockerfile.py --reuse-venv .venv --offline
Exit status 0 when every step passed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# Top-level folders that belong to the host system, never mapped into the replay's temp root.
SYSTEM_ROOTS = {"bin", "sbin", "usr", "lib", "lib64", "etc", "dev", "proc", "sys", "var", "run", "root"}
ROOT_ONLY_COMMANDS = {"useradd", "adduser", "groupadd", "addgroup", "usermod", "apt-get", "apt", "chown"}


# --- parsing ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction: keyword upper-cased, arguments as written (continuations joined)."""

    keyword: str
    args: str
    line: int


def parse_dockerfile(text: str) -> list[Instruction]:
    """Split a Dockerfile into instructions, joining ``\\`` continuations and dropping comments."""
    instructions: list[Instruction] = []
    buffer: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not buffer):
            continue  # comments may sit inside a continuation; Docker drops them too
        if not buffer:
            start = number
        if stripped.endswith("\\"):
            buffer.append(stripped[:-1].strip())
            continue
        buffer.append(stripped)
        logical = " ".join(part for part in buffer if part)
        buffer = []
        keyword, _, args = logical.partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip(), start))
    return instructions


_VAR = re.compile(r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?::(?P<op>[-+])(?P<word>[^}]*))?\}|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))")


def substitute(value: str, variables: dict[str, str]) -> str:
    """Docker's variable substitution: ``$X``, ``${X}``, ``${X:-word}``, ``${X:+word}``."""

    def replace(match: re.Match[str]) -> str:
        name = match.group("braced") or match.group("bare")
        current = variables.get(name, "")
        op = match.group("op")
        if op == "-":
            return current or substitute(match.group("word"), variables)
        if op == "+":
            return substitute(match.group("word"), variables) if current else ""
        return current

    return _VAR.sub(replace, value)


def parse_key_values(args: str) -> list[tuple[str, str]]:
    """``ENV``/``ARG``/``LABEL`` arguments: ``K=V K2="v 2"``, or the legacy ``ENV K some value``."""
    words = shlex.split(args, posix=True)
    if words and "=" not in words[0]:
        return [(words[0], " ".join(words[1:]))]
    pairs = []
    for word in words:
        key, sep, value = word.partition("=")
        pairs.append((key, value if sep else ""))
    return pairs


def split_flags(args: str) -> tuple[dict[str, str], str]:
    """Leading ``--flag=value`` options of COPY/HEALTHCHECK, and the rest of the line."""
    flags: dict[str, str] = {}
    rest = args
    while rest.startswith("--"):
        word, _, rest = rest.partition(" ")
        key, _, value = word[2:].partition("=")
        flags[key] = value
        rest = rest.lstrip()
    return flags, rest


def command_words(args: str) -> tuple[list[str], bool]:
    """ENTRYPOINT/CMD/RUN arguments as (words, is_exec_form)."""
    if args.startswith("["):
        return list(json.loads(args)), True
    return ["/bin/sh", "-c", args], False


# --- .dockerignore ------------------------------------------------------------------------------
def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out + r"(?:/.*)?\Z")  # a matching folder excludes what it holds


def load_dockerignore(context: Path) -> list[tuple[bool, re.Pattern[str]]]:
    """(is_exception, regex) per line of ``.dockerignore``; the last match decides."""
    path = context / ".dockerignore"
    rules = []
    if path.exists():
        for line in path.read_text().splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            rules.append((negate, _pattern_regex(line.lstrip("!").strip("/"))))
    return rules


def is_ignored(relative: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    ignored = False
    for negate, regex in rules:
        if regex.match(relative):
            ignored = not negate
    return ignored


# --- the replay ---------------------------------------------------------------------------------
class ReplayError(RuntimeError):
    """A step of the Dockerfile failed the way it would fail in ``docker build``."""


@dataclass
class Stage:
    name: str
    base: str
    root: Path
    env: dict[str, str]
    args: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    user: str = "root"


@dataclass
class Result:
    steps: list[tuple[str, bool, float, str]] = field(default_factory=list)

    def add(self, name: str, ok: bool, seconds: float, note: str = "") -> None:
        self.steps.append((name, ok, seconds, note))
        print(f"[{'PASS' if ok else 'FAIL'}] {name} ({seconds:.1f} s){': ' + note if note else ''}", flush=True)

    @property
    def ok(self) -> bool:
        return bool(self.steps) and all(ok for _, ok, _, _ in self.steps)


def log(message: str) -> None:
    print(f"replay: {message}", flush=True)


class Replayer:
    """Builds the image's file system under ``tmp`` by running the Dockerfile's steps on this host."""

    def __init__(self, dockerfile: Path, context: Path, tmp: Path, build_args: dict[str, str],
                 reuse_venv: Path | None, torch_index: str | None, verbose: bool = False,
                 offline: bool = False) -> None:
        self.instructions = parse_dockerfile(dockerfile.read_text())
        self.context = context
        self.tmp = tmp
        self.build_args = build_args
        self.reuse_venv = reuse_venv
        self.torch_index = torch_index
        self.verbose = verbose
        self.offline = offline
        self.ignore_rules = load_dockerignore(context)
        self.roots = self._image_roots()
        self.stages: dict[str, Stage] = {}
        self.stage: Stage | None = None
        self.exposed: list[str] = []
        self.healthcheck: list[str] | None = None
        self.entrypoint: list[str] = []
        self.cmd: list[str] = []
        self.shims = tmp / "_shims"

    # paths ------------------------------------------------------------------------------------
    def _image_roots(self) -> set[str]:
        """First components of the absolute image paths this Dockerfile uses (``opt``, ``home``...)."""
        found: set[str] = set()
        for ins in self.instructions:
            if ins.keyword in {"WORKDIR", "COPY", "ADD", "ENV"}:
                for path in re.findall(r"(?:^|[\s=:\"'])/([A-Za-z0-9_.-]+)", ins.args):
                    found.add(path)
        return found - SYSTEM_ROOTS

    def map_paths(self, text: str, stage: Stage | None = None) -> str:
        """Rewrite absolute image paths in ``text`` to their place under the stage's temp root."""
        stage = stage or self.stage
        assert stage is not None
        if not self.roots:
            return text
        roots = "|".join(re.escape(r) for r in sorted(self.roots))
        pattern = re.compile(rf"(?<![\w.~/:-])/({roots})(?=/|$|[\s\"':;,)])")
        return pattern.sub(lambda m: str(stage.root) + "/" + m.group(1), text)

    def image_path(self, path: str, stage: Stage | None = None) -> Path:
        stage = stage or self.stage
        assert stage is not None
        if not path.startswith("/"):
            path = stage.workdir.rstrip("/") + "/" + path
        return Path(self.map_paths(path, stage)) if path.split("/")[1] in self.roots else stage.root / path.lstrip("/")

    # stages -----------------------------------------------------------------------------------
    def _base_env(self, image: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH"}}
        # the project's own venv must not leak into the "image": drop venv bin folders from PATH.
        path = [p for p in env.get("PATH", "").split(":") if p and not (Path(p).parent / "pyvenv.cfg").exists()]
        self.shims.mkdir(parents=True, exist_ok=True)
        if image.startswith("python"):
            base_python = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
            for name in ("python", "python3"):
                link = self.shims / name
                if not link.exists():
                    link.symlink_to(base_python)
            path.insert(0, str(self.shims))
            log(f"base image {image} -> host interpreter {base_python} (Python {sys.version.split()[0]})")
        elif image.startswith("node"):
            versions = []
            for tool in ("node", "npm"):
                exe = shutil.which(tool)
                if exe is None:
                    raise ReplayError(f"base image {image} needs `{tool}` on this host (apt-get install nodejs npm)")
                versions.append(f"{tool} {subprocess.run([exe, '--version'], capture_output=True, text=True).stdout.strip()}")
            log(f"base image {image} -> host {', '.join(versions)}")
        else:
            log(f"base image {image} -> this host as it is (no equivalent known)")
        env["PATH"] = ":".join(path)
        env.pop("PIP_NO_CACHE_DIR", None)
        if self.offline:  # every install must be satisfied by what is here already (caches, --reuse-venv)
            env.update({"PIP_NO_INDEX": "1", "npm_config_offline": "true", "HF_HUB_OFFLINE": "1"})
        return env

    def do_FROM(self, ins: Instruction, global_args: dict[str, str]) -> None:
        words = substitute(ins.args, global_args).split()
        image = words[0]
        name = words[2] if len(words) >= 3 and words[1].lower() == "as" else str(len(self.stages))
        root = self.tmp / f"stage-{name}"
        root.mkdir(parents=True)
        self.stage = Stage(name=name, base=image, root=root, env=self._base_env(image))
        self.stages[name] = self.stage
        log(f"--- stage {name} (FROM {image}) at {root}")

    def variables(self) -> dict[str, str]:
        assert self.stage is not None
        return {**self.stage.env, **self.stage.args}

    def do_ARG(self, ins: Instruction) -> None:
        assert self.stage is not None
        for key, default in parse_key_values(ins.args):
            value = self.build_args.get(key, substitute(default, self.variables()))
            self.stage.args[key] = value
            log(f"ARG {key}={value!r}")

    def do_ENV(self, ins: Instruction) -> None:
        assert self.stage is not None
        for key, raw in parse_key_values(ins.args):
            value = self.map_paths(substitute(raw, self.variables()))
            if key == "PIP_NO_CACHE_DIR":
                log("ENV PIP_NO_CACHE_DIR ignored: the replay keeps pip's cache so that a second run is faster")
                continue
            self.stage.env[key] = value

    def do_WORKDIR(self, ins: Instruction) -> None:
        assert self.stage is not None
        path = substitute(ins.args, self.variables())
        if not path.startswith("/"):
            path = self.stage.workdir.rstrip("/") + "/" + path
        self.stage.workdir = path
        self.image_path(path).mkdir(parents=True, exist_ok=True)

    def do_USER(self, ins: Instruction) -> None:
        assert self.stage is not None
        self.stage.user = substitute(ins.args, self.variables())
        log(f"USER {self.stage.user}: not switched (the replay runs as uid {os.getuid()})")

    def do_COPY(self, ins: Instruction) -> None:
        assert self.stage is not None
        flags, rest = split_flags(ins.args)
        words = [substitute(w, self.variables()) for w in (json.loads(rest) if rest.startswith("[") else rest.split())]
        sources, dest = words[:-1], words[-1]
        if "from" in flags:
            source_stage = self.stages.get(flags["from"])
            if source_stage is None:
                raise ReplayError(f"line {ins.line}: COPY --from={flags['from']}: no such stage")
            resolved = [(self.image_path(s, source_stage), None) for s in sources]
        else:
            resolved = [(self.context / s, s) for s in sources]
        target = self.image_path(dest)
        as_dir = dest.endswith("/") or dest in {".", "./"} or len(sources) > 1 or target.is_dir()
        for src, relative in resolved:
            if not src.exists():
                raise ReplayError(f"line {ins.line}: COPY {src}: not found (docker build would stop here)")
            if src.is_dir():
                self._copy_tree(src, target, relative)
            else:
                dst = target / src.name if as_dir else target
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
        log(f"COPY {' '.join(sources)} -> {target}")

    def _copy_tree(self, src: Path, target: Path, relative: str | None) -> None:
        for path in sorted(src.rglob("*")):
            if relative is not None:  # from the build context: .dockerignore applies
                rel = os.path.normpath(os.path.join(relative, str(path.relative_to(src))))
                if is_ignored(rel, self.ignore_rules):
                    continue
            dst = target / path.relative_to(src)
            if path.is_dir():
                dst.mkdir(parents=True, exist_ok=True)
            elif path.is_file():
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, dst)

    def _rewrite_run(self, command: str) -> str | None:
        """The command to run here, or None to skip it; says what it changed."""
        assert self.stage is not None
        first = command.split()[0] if command.split() else ""
        if first in ROOT_ONLY_COMMANDS:
            log(f"SKIPPED (needs root in an image, not replayable): {command}")
            return None
        venv = re.match(r"python3? -m venv (\S+)$", command.strip())
        if venv and self.reuse_venv is not None:
            target = Path(self.map_paths(venv.group(1)))
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(self.reuse_venv.resolve())
            log(f"SUBSTITUTED: `{command}` -> link to the existing venv {self.reuse_venv} (--reuse-venv)")
            return None
        option = re.search(r"(--(?:extra-)?index-url)[ =](\"[^\"]*\"|'[^']*'|\S+)", command)
        if option and "pip" in command:
            url = substitute(option.group(2).strip("\"'"), self.variables())
            if self.torch_index:
                log(f"SUBSTITUTED: {option.group(1)} {url} -> {self.torch_index} (--torch-index)")
                return command.replace(option.group(0), f"{option.group(1)} {shlex.quote(self.torch_index)}")
            if self.offline or not reachable(url):
                why = "--offline" if self.offline else "unreachable from here"
                log(f"SUBSTITUTED: {option.group(1)} {url} ({why}) -> dropped; pip uses this "
                    "machine's configured indexes (PyPI, local wheels). The image itself installs from the URL.")
                return command.replace(option.group(0), "")
        return self.map_paths(command)

    def do_RUN(self, ins: Instruction) -> None:
        assert self.stage is not None
        flags, rest = split_flags(ins.args)
        words, exec_form = command_words(rest)
        command = rest if not exec_form else shlex.join(words)
        rewritten = self._rewrite_run(command)
        if rewritten is None:
            return
        cwd = self.image_path(self.stage.workdir)
        cwd.mkdir(parents=True, exist_ok=True)
        env = {**self.stage.env, **self.stage.args}
        log(f"RUN {rewritten}")
        started = time.monotonic()
        if self.verbose:
            done = subprocess.run(["/bin/sh", "-c", rewritten], cwd=cwd, env=env)
        else:  # the output goes to a log; its tail is shown if the step fails
            done = subprocess.run(["/bin/sh", "-c", rewritten], cwd=cwd, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            with (self.tmp / "build.log").open("a") as build_log:
                build_log.write(f"### line {ins.line}: {rewritten}\n{done.stdout}\n")
        if done.returncode != 0:
            tail = "" if self.verbose else "\n" + "\n".join(done.stdout.splitlines()[-25:])
            raise ReplayError(f"line {ins.line}: RUN exited {done.returncode}: {rewritten}{tail}")
        log(f"    done in {time.monotonic() - started:.1f} s")

    def build(self) -> None:
        global_args: dict[str, str] = {}
        for ins in self.instructions:
            if ins.keyword == "FROM":
                self.do_FROM(ins, global_args)
            elif self.stage is None and ins.keyword == "ARG":
                for key, default in parse_key_values(ins.args):
                    global_args[key] = self.build_args.get(key, default)
            elif ins.keyword in {"ARG", "ENV", "WORKDIR", "USER", "COPY", "RUN"}:
                getattr(self, f"do_{ins.keyword}")(ins)
            elif ins.keyword == "EXPOSE":
                self.exposed = substitute(ins.args, self.variables()).split()
            elif ins.keyword == "HEALTHCHECK":
                _, rest = split_flags(ins.args)
                if rest.upper().startswith("CMD "):
                    self.healthcheck, _ = command_words(rest[4:].strip())
            elif ins.keyword == "ENTRYPOINT":
                self.entrypoint, _ = command_words(ins.args)
                self.cmd = []  # Docker resets CMD when ENTRYPOINT is set
            elif ins.keyword == "CMD":
                self.cmd, _ = command_words(ins.args)
            else:
                log(f"{ins.keyword} at line {ins.line}: nothing to replay")

    # running ----------------------------------------------------------------------------------
    def runtime(self) -> tuple[list[str], dict[str, str], Path]:
        """The container's command, environment and working folder, paths mapped."""
        assert self.stage is not None
        command = [self.map_paths(word) for word in self.entrypoint + self.cmd]
        if not command:
            raise ReplayError("the Dockerfile has neither ENTRYPOINT nor CMD")
        return command, dict(self.stage.env), self.image_path(self.stage.workdir)


def reachable(url: str, timeout: float = 5.0) -> bool:
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout)
        return True
    except urllib.error.HTTPError:
        return True  # the server answered
    except (urllib.error.URLError, OSError, ValueError):
        return False


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(health: list[str], env: dict[str, str], cwd: Path, server: subprocess.Popen[bytes],
                 timeout: float) -> tuple[bool, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            return False, f"the app exited with status {server.returncode} before it was healthy"
        probe = subprocess.run(health, env=env, cwd=cwd, capture_output=True, text=True)
        if probe.returncode == 0:
            return True, "HEALTHCHECK command exited 0"
        time.sleep(1.0)
    return False, f"not healthy after {timeout:.0f} s"


def check_page(url: str, expect: str, static_file: str | None, screenshot: Path, timeout: float) -> tuple[bool, str]:
    """Load ``url`` in headless Chromium; the app must render ``expect`` and no exception element."""
    from playwright.sync_api import sync_playwright

    notes: list[str] = []
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(url, timeout=timeout * 1000)
            page.wait_for_selector('[data-testid="stApp"]', timeout=timeout * 1000)
            # The first run loads a model: wait until the script has stopped running for 2 s.
            deadline = time.monotonic() + timeout
            quiet_since = None
            while time.monotonic() < deadline:
                running = page.locator('[data-testid="stStatusWidget"]').count() > 0
                if running:
                    quiet_since = None
                elif quiet_since is None:
                    quiet_since = time.monotonic()
                elif time.monotonic() - quiet_since > 2.0:
                    break
                time.sleep(0.25)
            page.screenshot(path=str(screenshot), full_page=True)
            notes.append(f"screenshot {screenshot}")
            exceptions = page.locator('[data-testid="stException"]')
            if exceptions.count():
                return False, "the page shows an exception: " + exceptions.first.inner_text()[:500]
            text = page.locator('[data-testid="stApp"]').inner_text()
            if expect.lower() not in text.lower():
                return False, f"expected text {expect!r} not on the page; it shows: {text[:300]!r}"
            notes.append(f"found {expect!r}")
            if static_file:
                response = page.request.get(url.rstrip("/") + "/app/static/" + static_file)
                if response.status != 200:
                    return False, f"/app/static/{static_file} answered {response.status}"
                notes.append(f"/app/static/{static_file} served ({len(response.body())} bytes)")
            if errors:
                return False, "JavaScript errors: " + "; ".join(errors[:3])
            return True, ", ".join(notes)
        finally:
            browser.close()


def stop(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)  # our own process group, started below
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dockerfile", type=Path, default=REPO / "Dockerfile")
    parser.add_argument("--context", type=Path, default=REPO)
    parser.add_argument("--build-arg", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--reuse-venv", type=Path, default=None,
                        help="link the image's venv to this one instead of `python -m venv` (quick mode)")
    parser.add_argument("--torch-index", default=None, help="use this index instead of the Dockerfile's torch index")
    parser.add_argument("--port", type=int, default=None, help="PORT for the container (default: the Dockerfile's)")
    parser.add_argument("--expect", default="Attention Explorer", help="text the rendered page must contain")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds to wait for health and for the page")
    parser.add_argument("--screenshot", type=Path, default=Path(tempfile.gettempdir()) / "replay_dockerfile.png")
    parser.add_argument("--keep", action="store_true", help="keep the temporary image folder")
    parser.add_argument("--verbose", action="store_true", help="show the output of every RUN step")
    parser.add_argument("--offline", action="store_true",
                        help="no network: pip and npm use only what is installed or cached (for the test suite)")
    args = parser.parse_args(argv)

    build_args = dict(arg.partition("=")[::2] for arg in args.build_arg)
    tmp = Path(tempfile.mkdtemp(prefix="replay-dockerfile-"))
    result = Result()
    started = time.monotonic()
    server = None
    try:
        replayer = Replayer(args.dockerfile.resolve(), args.context.resolve(), tmp, build_args,
                            args.reuse_venv, args.torch_index, args.verbose, args.offline)
        log(f"{args.dockerfile}: {len(replayer.instructions)} instructions; image paths under /"
            f"{', /'.join(sorted(replayer.roots))} map to {tmp}")
        t0 = time.monotonic()
        try:
            replayer.build()
        except (ReplayError, subprocess.SubprocessError, OSError) as error:
            result.add("build: replay the Dockerfile's steps", False, time.monotonic() - t0, str(error))
            return summary(result, started)
        result.add("build: replay the Dockerfile's steps", True, time.monotonic() - t0)

        command, env, cwd = replayer.runtime()
        exposed = [e.split("/")[0] for e in replayer.exposed]
        result.add("ports: EXPOSE matches the image's PORT", env.get("PORT") in exposed, 0.0,
                   f"EXPOSE {' '.join(exposed) or '(none)'}, PORT={env.get('PORT')}")
        port = args.port or int(env.get("PORT") or (exposed[0] if exposed else 8501))
        if not port_free(port):
            chosen = free_port()
            log(f"port {port} is busy on this host: PORT={chosen} instead (the entrypoint must honour PORT)")
            port = chosen
        env["PORT"] = str(port)
        log(f"start: {shlex.join(command)} (cwd {cwd}, PORT={port})")
        t0 = time.monotonic()
        server = subprocess.Popen(command, cwd=cwd, env=env, start_new_session=True)
        if replayer.healthcheck is None:
            result.add("health", False, 0.0, "the Dockerfile has no HEALTHCHECK CMD")
            return summary(result, started)
        health = [replayer.map_paths(w) for w in replayer.healthcheck]
        ok, note = wait_healthy(health, env, cwd, server, args.timeout)
        result.add("health: the Dockerfile's HEALTHCHECK passes", ok, time.monotonic() - t0, note)
        if not ok:
            return summary(result, started)

        vendor = cwd / "static" / "vendor"
        files = sorted(vendor.rglob("*.js")) if vendor.is_dir() else []
        static_file = str(files[0].relative_to(cwd / "static")) if files else None
        t0 = time.monotonic()
        try:
            ok, note = check_page(f"http://127.0.0.1:{port}/", args.expect, static_file, args.screenshot, args.timeout)
        except Exception as error:  # a browser failure is a FAIL line, not a traceback
            ok, note = False, f"{type(error).__name__}: {error}"
        result.add("page: renders in headless Chromium", ok, time.monotonic() - t0, note)
        return summary(result, started)
    finally:
        if server is not None:
            stop(server)
        if args.keep:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def summary(result: Result, started: float) -> int:
    verdict = "PASS" if result.ok else "FAIL"
    print(f"\nreplay_dockerfile: {verdict}: {sum(ok for _, ok, _, _ in result.steps)} of "
          f"{len(result.steps)} steps passed in {time.monotonic() - started:.0f} s", flush=True)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
