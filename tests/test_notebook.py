"""docs/quickstart.ipynb run top to bottom by a real kernel, converted to HTML, and drawn offline in Chromium."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.browser import CHROMIUM, CHROMIUM_MISSING

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "docs" / "quickstart.ipynb"
# nbconvert's own page loads require.js, MathJax and mermaid from CDNs; the notebook has no maths or diagrams,
# so the HTML leaves them out (our outputs carry their own scripts). Everything else is the stock "lab" template.
OFFLINE_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
"""


@pytest.fixture(scope="module")
def executed():
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
                   ).execute()  # raises CellExecutionError on the first failing cell
    return nb


def _outputs(nb, needle: str) -> list[dict]:
    """The outputs of the code cells whose source contains ``needle``."""
    return [out for cell in nb.cells if cell.cell_type == "code" and needle in cell.source for out in cell.outputs]


def test_every_cell_runs_without_an_error(executed):
    errors = [out for cell in executed.cells if cell.cell_type == "code" for out in cell.outputs
              if out.output_type == "error"]
    assert not errors
    assert all(cell.execution_count for cell in executed.cells if cell.cell_type == "code")


def test_the_trace_and_its_views_show_themselves(executed):
    (trace_out,) = [o for o in _outputs(executed, "ae.trace(") if o.output_type == "execute_result"]
    assert "6 layers x 12 heads" in trace_out.data["text/plain"]
    (view,) = [o for o in _outputs(executed, "t.head_view(") if o.output_type == "execute_result"]
    html = view.data["text/html"]
    assert html.startswith("<iframe srcdoc=") and "cdnjs" not in html and "src=&quot;http" not in html
    (figure,) = [o for o in _outputs(executed, "t.heatmap(") if o.output_type == "display_data"]  # Plotly displays
    assert "application/vnd.plotly.v1+json" in figure.data and "text/html" in figure.data


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason=CHROMIUM_MISSING)
def test_the_html_export_draws_the_head_view_and_the_heatmap_with_no_outside_request(executed, tmp_path):
    from nbconvert import HTMLExporter
    from playwright.sync_api import sync_playwright

    (tmp_path / "offline").mkdir()
    (tmp_path / "offline" / "index.html.j2").write_text(OFFLINE_TEMPLATE)
    (tmp_path / "offline" / "conf.json").write_text('{"base_template": "lab", "mimetypes": {"text/html": true}}')
    exporter = HTMLExporter(extra_template_basedirs=[str(tmp_path)], template_name="offline")
    body, _ = exporter.from_notebook_node(executed)
    page_path = tmp_path / "quickstart.html"
    page_path.write_text(body, encoding="utf-8")

    requests, errors = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            context = browser.new_context()
            context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(("file:", "about:", "data:", "blob:"))
                          else route.abort())
            page = context.new_page()
            page.on("request", lambda r: requests.append(r.url))
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(page_path.as_uri())
            head = page.frame_locator("iframe").first  # the head view is the first view of the notebook
            head.locator("svg line").first.wait_for(state="attached", timeout=60_000)
            n_lines = head.locator("svg line").count()
            page.locator(".plotly .main-svg").first.wait_for(state="attached", timeout=60_000)
            n_plots = page.locator(".js-plotly-plot").count()
        finally:
            browser.close()
    outside = [u for u in requests if not u.startswith(("file:", "about:", "data:", "blob:"))]
    assert outside == [], outside
    assert not errors, errors
    assert n_lines >= 12 * 13 * 13  # every weight of layer 2's twelve heads, 13 pieces
    assert n_plots == 2  # the heatmap and the overview
