"""The image test's checks of a running container (steps 5-10 of ``scripts/image_test.py``): start it as uid
1000, wait for its own HEALTHCHECK, then its files, the bundled decoder, every page, bertviz and the memory."""

import contextlib
import json
import os
import re
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

from image_common import (
    BUILDAH,
    BUNDLED_DECODER_DIR,
    CACHE,
    LOCAL_HOSTS,
    LONG_TEXT,
    Report,
    free_port,
    image_config,
    sh,
)


# -- 5-7. the running container ---------------------------------------------------------------------------
class Container:
    """One container of the image, its ENTRYPOINT running as uid 1000 on a free host port."""

    def __init__(self, image: str, name: str, env: dict[str, str]) -> None:
        self.name, self.port = name, free_port()
        sh([*BUILDAH, "rm", name])
        sh([*BUILDAH, "from", "--name", name, image], check=True)
        self.config = image_config(image)
        self.env = {**dict(e.split("=", 1) for e in self.config.get("Env", [])), "PORT": str(self.port), **env}
        self.log = open(CACHE / f"{name}.log", "w")
        flags = [f"--env={k}={v}" for k, v in self.env.items()]
        self.proc = subprocess.Popen([*BUILDAH, "run", "--isolation", "chroot", "--user", "1000:1000", *flags,
                                      "--workingdir", self.config.get("WorkingDir") or "/", name, "--",
                                      *self.config["Entrypoint"], *(self.config.get("Cmd") or [])],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.started = time.perf_counter()

    def run(self, *command: str, user: str = "1000:1000") -> subprocess.CompletedProcess:
        flags = [f"--env={k}={v}" for k, v in self.env.items()]
        return sh([*BUILDAH, "run", "--isolation", "chroot", "--user", user, *flags, self.name, "--", *command],
                  timeout=120)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def server_pid(self) -> int | None:
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                except OSError:
                    continue
                if "streamlit run app.py" in cmd and f"--server.port={self.port}" in cmd:
                    return int(proc.name)
        return None

    def rss_mb(self) -> float | None:
        pid = self.server_pid()
        if pid is None:
            return None
        status = Path(f"/proc/{pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024

    def log_tail(self) -> str:
        self.log.flush()
        return (CACHE / f"{self.name}.log").read_text(errors="replace")[-2000:]

    def stop(self) -> None:
        if self.proc.poll() is not None and self.log.closed:
            return
        pid = self.server_pid()
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 15)
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        sh([*BUILDAH, "rm", self.name])
        self.log.close()


def wait_healthy(report: Report, box: Container) -> bool:
    """The image's own HEALTHCHECK command, inside the container, until it passes."""
    check = box.config["Healthcheck"]
    test = check["Test"]
    command = ["/bin/sh", "-c", test[1]] if test[0] == "CMD-SHELL" else test[1:]
    limit = check.get("StartPeriod", 90e9) / 1e9 + check.get("Retries", 3) * check.get("Interval", 30e9) / 1e9
    while time.perf_counter() - box.started < limit:
        if box.proc.poll() is not None:
            return report.step("healthcheck", False, f"the container exited {box.proc.returncode}:\n{box.log_tail()}")
        if box.run(*command).returncode == 0:
            seconds = time.perf_counter() - box.started
            report.figures["start to healthy s"] = round(seconds, 1)
            return report.step("healthcheck", True, f"the image's HEALTHCHECK passed {seconds:.1f} s after start")
        time.sleep(1)
    return report.step("healthcheck", False, f"not healthy after {limit:.0f} s:\n{box.log_tail()}")


def check_files(report: Report, box: Container) -> None:
    app = box.config.get("WorkingDir") or "/home/user/app"
    owners = box.run("stat", "-c", "%U %n", app, f"{app}/app.py", f"{app}/model_core/settings.py",
                     f"{app}/static/vendor/require.js", f"{app}/docker/entrypoint.sh")
    wrong = [line for line in owners.stdout.splitlines() if not line.startswith("user ")]
    report.step("files belong to user", owners.returncode == 0 and not wrong, owners.stderr.strip() or
                ("; ".join(wrong) if wrong else f"{len(owners.stdout.splitlines())} paths owned by user"))
    write = box.run("/bin/sh", "-c", 'mkdir -p "$HF_HOME/hub" && echo ok > "$HF_HOME/hub/.write-test" '
                    '&& rm "$HF_HOME/hub/.write-test" && id -u')
    report.step("HF cache writable", write.returncode == 0 and write.stdout.strip() == "1000",
                write.stderr.strip() or f"uid {write.stdout.strip()} wrote into {box.env.get('HF_HOME')}")
    leaked = box.run("/bin/sh", "-c", f"cd {app} && ls -d .venv .git node_modules screenshots 2>/dev/null; true")
    report.step("no local state copied", not leaked.stdout.strip(), leaked.stdout.strip() or "none of .venv, .git, "
                "node_modules, screenshots")


# Run in the container: the app's own lookup (bundled.py loaded by path: no torch import) must find the folder
# complete and convert nothing; it prints the folder and the progress messages (none expected).
FIND_BUNDLED = (
    "import importlib.util, json, sys\n"
    "spec = importlib.util.spec_from_file_location('_ae_bundled', sys.argv[1])\n"
    "module = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(module)\n"
    "messages = []\n"
    "print(json.dumps([str(module.ensure_bundled_decoder(messages.append)), messages]))\n"
)


def check_bundled_decoder(report: Report, box: Container) -> None:
    """The decoder converted at build time: a complete folder under AE_MODEL_CACHE, found without converting."""
    app = box.config.get("WorkingDir") or "/home/user/app"
    cache = box.env.get("AE_MODEL_CACHE", "")
    folder = f"{cache}/{BUNDLED_DECODER_DIR}"
    listing = box.run("/bin/sh", "-c", f'cd "{folder}" && test -r config.json && test -r model.safetensors '
                      f'&& test -r .complete && du -sk .')
    if not cache or listing.returncode != 0:
        report.step("bundled decoder in the image", False, f"no complete {folder} (AE_MODEL_CACHE={cache!r}): "
                    f"{listing.stderr.strip()[:300]}")
        return
    megabytes = int(listing.stdout.split()[0]) / 1024
    report.figures["bundled decoder MB"] = round(megabytes)
    found = box.run("python", "-c", FIND_BUNDLED, f"{app}/model_core/models/bundled.py")
    try:
        path, messages = json.loads(found.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        path, messages = None, [found.stderr.strip()[-300:]]
    ok = path == folder and not messages
    report.step("bundled decoder in the image", ok, f"{folder}: {megabytes:.0f} MB, found as is" if ok else
                f"ensure_bundled_decoder() gave {path!r}, wanted {folder!r}; it said {messages}")


# -- 8-10. the browser --------------------------------------------------------------------------------------
def check_pages(report: Report, box: Container, browser) -> None:
    """Every page in one tab, each opened from the navigation as a user goes from page to page (a fresh browser
    context a page booted a Streamlit session each time: 21 boots, about a minute). The deep link is checked by
    ``check_bertviz``, which opens ``/bertviz`` directly."""
    from harness.browser import ScriptRuns, app_pages
    from harness.press import Presser

    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    outside: list[str] = []
    page.on("request", lambda r: outside.append(r.url) if r.url.startswith(("http", "ws"))
            and urllib.parse.urlparse(r.url).hostname not in LOCAL_HOSTS else None)
    presser = Presser(page, ScriptRuns(page), f"{box.url}/", run_timeout_s=300)
    try:
        for i, (_, title) in enumerate(app_pages()):
            seen = len(presser.report.failures)
            try:
                if i == 0:
                    presser.start()  # the first page (Home): the app's own address
                else:
                    presser.open(title)
                problems = presser.report.failures[seen:] + [f"outside request {u}" for u in outside]
                outside.clear()
                report.step(f"page {title}", not problems, "; ".join(problems)[:500])
            except Exception as exc:  # noqa: BLE001 - a page that never finishes is a FAIL, not a crash
                report.step(f"page {title}", False, f"{type(exc).__name__}: {exc}"[:500])
    finally:
        context.close()


def check_bertviz(report: Report, box: Container, browser) -> None:
    from harness.browser import wait_for_run

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(f"{box.url}/bertviz", wait_until="domcontentloaded")
        wait_for_run(page, 300)
        frame = page.frame_locator('iframe[title="bertviz head view"]')
        frame.locator("svg line").first.wait_for(state="attached", timeout=120_000)
        lines = page.locator('iframe[title="bertviz head view"]').element_handle().content_frame().evaluate(
            "document.querySelectorAll('svg line').length")
        report.step("bertviz head view", lines > 0, f"{lines} SVG lines drawn from static/vendor")
    except Exception as exc:  # noqa: BLE001
        report.step("bertviz head view", False, f"{type(exc).__name__}: {exc}"[:500])
    finally:
        page.close()


def check_memory(report: Report, box: Container, browser) -> None:
    from harness.browser import wait_for_run

    rest = box.rss_mb()
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(f"{box.url}/heatmaps?a={urllib.parse.quote(LONG_TEXT)}&b=&truncate=true", wait_until="domcontentloaded")
        wait_for_run(page, 300)
        page.wait_for_function(  # the sidebar's model line is drawn once the trace is: wait for it, not a quiet spell
            "() => /[\\d,]+ tokens\\b/.test((document.querySelector('section[data-testid=\"stSidebar\"]') || "
            "{innerText: ''}).innerText)", timeout=300_000)
        sidebar = page.locator('section[data-testid="stSidebar"]').inner_text()
        tokens = re.search(r"([\d,]+) tokens\b", sidebar).group(1)  # "… · 512 tokens · float32"
    except Exception as exc:  # noqa: BLE001
        report.step("memory", False, f"the 512-token page did not load: {exc}"[:300])
        return
    finally:
        page.close()
    after = box.rss_mb()
    report.figures["RSS at rest MB"] = None if rest is None else round(rest)
    report.figures["RSS after a 512-token page MB"] = None if after is None else round(after)
    report.step("memory", rest is not None and after is not None,
                f"server RSS {rest:.0f} MB at rest, {after:.0f} MB after the heatmaps page of a {tokens}-token text"
                if rest and after else "the server process was not found")
