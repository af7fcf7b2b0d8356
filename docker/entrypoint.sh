#!/bin/sh
# Container entrypoint: check the AE_* settings, then serve the app on 0.0.0.0:$PORT (default 7860).
# Extra arguments go to `streamlit run`, e.g. `docker run IMAGE --logger.level=debug`.
set -eu
cd "$(dirname "$0")/.."
PORT="${PORT:-7860}"
# Fail at start, with a message naming the variable, rather than on the first page view.
python docker/check_settings.py
exec streamlit run app.py --server.address=0.0.0.0 --server.port="$PORT" "$@"
