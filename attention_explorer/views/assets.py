"""Where bertviz's views get require.js, d3 and jQuery: served by the app, or inlined into the page.

bertviz's pages load these from a public CDN. Served (the app): the page names local copies that
Streamlit serves from ``static/vendor/``. Inlined (notebooks and downloaded files): the files come
from this package's ``vendor/`` folder (filled by ``scripts/install_assets.sh``, carried by the
wheel) into the page itself, so it draws offline and asks nothing of any server.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

DEFAULT_ASSET_BASE = "app/static/vendor"
"""Where a served page finds require.js, d3 and jQuery. Relative, so that a srcdoc iframe resolves it
against the app's own address (and any ``server.baseUrlPath``)."""

VENDOR_FILES = ("require.js", "d3v3.min.js", "d3v5.min.js", "jquery.min.js")
"""Files ``scripts/install_assets.sh`` puts in static/vendor/ and in this package's vendor/."""

PACKAGE_VENDOR = Path(__file__).resolve().parent / "vendor"

# d3 per view: the head view draws with d3 3.x (bertviz's head_view.js falls back to
# d3.scale.category10), the model and neuron views need d3 >= 4 (d3.schemeCategory10, d3.line).
D3_FOR_VIEW = {"head": "d3v3.min", "model": "d3v5.min", "neuron": "d3v5.min"}

_CDN = re.compile(r"https://cdnjs\.cloudflare\.com/ajax/libs/(require\.js|d3|jquery)/[^'\"]+?\.min(\.js)?(?=['\"])")
_QUOTED_URL = re.compile(r"""["'](https?:)?//""")
_REQUIRE_TAG = re.compile(r"<script src=\"[^\"]*require(\.min)?\.js\"></script>")
_PATH_LINE = re.compile(r"^\s*(d3|jquery): '[^']*',?\s*$", re.MULTILINE)


def vendor_missing(static_dir: str | Path) -> list[str]:
    """The files of ``VENDOR_FILES`` missing from ``static_dir``/vendor (empty when installed)."""
    vendor = Path(static_dir) / "vendor"
    return [name for name in VENDOR_FILES if not (vendor / name).is_file()]


@cache
def _vendor_text(name: str) -> str:
    path = PACKAGE_VENDOR / name
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing, so bertviz's views cannot be inlined. In a checkout, run `make setup` "
            "(or scripts/install_assets.sh; it needs Node.js and npm); an installed wheel carries these files."
        )
    # A literal "</script>" inside a script would end it early.
    return path.read_text(encoding="utf-8").replace("</script>", "<\\/script>")


def _check_no_outside_address(html: str) -> str:
    # Only quoted addresses load anything (the scripts' header comments name their sources).
    if _QUOTED_URL.search(html):
        raise RuntimeError(
            "bertviz's page still names an outside address after localizing; the installed bertviz "
            "differs from 1.4.1. Check attention_explorer/views/assets._CDN against bertviz's *_view.js files."
        )
    return html


def serve_scripts(html: str, kind: str, asset_base: str) -> str:
    """Point bertviz's CDN addresses at the copies under ``asset_base``."""
    base = asset_base.rstrip("/")

    def local(match: re.Match[str]) -> str:
        lib = match.group(1)
        if lib == "require.js":
            return f"{base}/require.js"
        if lib == "d3":
            return f"{base}/{D3_FOR_VIEW[kind]}"
        return f"{base}/jquery.min"

    return _check_no_outside_address(_CDN.sub(local, html))


def inline_scripts(html: str, kind: str) -> str:
    """Put require.js, d3 and jQuery into the page itself, so that it loads nothing.

    d3 and jQuery run first, before require.js defines ``define``, so they set plain globals; then
    require.js, and two named modules hand those globals to bertviz's ``require(['jquery', 'd3'])``.
    """
    html, n_tags = _REQUIRE_TAG.subn("<!-- ae:scripts -->", html, count=1)
    if n_tags != 1:
        raise RuntimeError("bertviz's page no longer loads require.js with a <script src> tag as 1.4.1 did; "
                           "update attention_explorer/views/assets._REQUIRE_TAG.")
    # Checked before the libraries go in: their own code names namespaces such as "http://www.w3.org/2000/svg".
    html = _check_no_outside_address(_PATH_LINE.sub("", html))
    d3, jquery, require = (_vendor_text(f"{D3_FOR_VIEW[kind]}.js"), _vendor_text("jquery.min.js"),
                           _vendor_text("require.js"))
    block = (f"<script>{d3}</script>\n<script>{jquery}</script>\n<script>{require}</script>\n"
             "<script>define('d3', [], function () { return window.d3; });\n"
             "define('jquery', [], function () { return window.jQuery; });</script>\n")
    return html.replace("<!-- ae:scripts -->", block, 1)
