#!/usr/bin/env bash
# Install the JavaScript that bertviz's views need (require.js, d3 3.x, d3 5.x, jQuery) from the
# npm registry, pinned by package-lock.json, and copy only the files the views load into
# static/vendor/, which Streamlit serves at /app/static/vendor/, and into
# attention_explorer/views/vendor/, package data that the wheel carries (the notebook views and the
# exported HTML inline them). Idempotent: a second run that finds the same lock file and all files
# in place does nothing.
set -euo pipefail

cd "$(dirname "$0")/.."
VENDOR=static/vendor
PACKAGE_VENDOR=attention_explorer/views/vendor
STAMP="$VENDOR/.lock-sha256"
# source in node_modules -> name under static/vendor
FILES=(
  "requirejs/require.js:require.js"
  "d3v3/d3.min.js:d3v3.min.js"
  "d3v5/dist/d3.min.js:d3v5.min.js"
  "jquery/dist/jquery.min.js:jquery.min.js"
)

lock_sha=$(sha256sum package-lock.json | cut -d' ' -f1)
all_there=1
for pair in "${FILES[@]}"; do
  [ -s "$VENDOR/${pair#*:}" ] && [ -s "$PACKAGE_VENDOR/${pair#*:}" ] || all_there=0
done
if [ "$all_there" = 1 ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$lock_sha" ]; then
  exit 0
fi

if ! command -v npm >/dev/null 2>&1; then
  echo "install_assets.sh: npm not found, so bertviz's views cannot be installed." >&2
  echo "  Install Node.js and npm (Debian: apt-get install nodejs npm), then run: make setup" >&2
  exit 1
fi

echo "Installing bertviz's JavaScript (npm ci, pinned by package-lock.json) into $VENDOR/"
npm ci --no-audit --no-fund --loglevel=error
mkdir -p "$VENDOR"
for pair in "${FILES[@]}"; do
  src="node_modules/${pair%%:*}"
  dst="$VENDOR/${pair#*:}"
  cp "$src" "$dst"
done
# jQuery's minified file names a source map that is not copied; drop the comment so that an
# open devtools does not ask the server for it.
sed -i '/^\/\/# sourceMappingURL=/d' "$VENDOR/jquery.min.js"
mkdir -p "$PACKAGE_VENDOR"
for pair in "${FILES[@]}"; do
  cp "$VENDOR/${pair#*:}" "$PACKAGE_VENDOR/${pair#*:}"
done
echo "$lock_sha" > "$STAMP"
echo "bertviz assets installed in $VENDOR/ and $PACKAGE_VENDOR/: $(ls "$VENDOR" | tr '\n' ' ')"
