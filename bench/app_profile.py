"""bench_app's profiles: py-spy's samples of the server and the page's JavaScript CPU profile, summarised."""

from __future__ import annotations

import collections
import re
from pathlib import Path

IDLE = r"select|wait|poll|sleep|_recv|accept"
"""A stack whose innermost frame matches this is an idle thread (event loop, worker queue), not busy time."""


def busy_samples(path: Path, *, full_paths: bool = False) -> tuple[collections.Counter, int]:
    """Inclusive busy samples per "file.py:function" (``full_paths``: "path/file.py:function") of py-spy's raw
    stacks, idle threads left out; and the total of busy samples."""
    inclusive: collections.Counter = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = stack.split(";")
        if re.search(IDLE, frames[-1]):
            continue
        total += int(count)
        seen = set()
        for f in frames:
            if f.startswith(("thread (", "process ")):  # py-spy's --threads names: ids differ between servers
                continue
            m = re.match(r"(.*?) \((.*?):\d+\)", f)  # "function (path/file.py:line)"
            name = f"{m.group(2) if full_paths else Path(m.group(2)).name}:{m.group(1)}" if m else f
            if name not in seen:
                seen.add(name)
                inclusive[name] += int(count)
    return inclusive, total


def profile_summary(path: Path, top: int = 25) -> str:
    """Inclusive share of the sampled time for the busiest functions of the app and its libraries."""
    inclusive, total = busy_samples(path)
    if not total:
        return "no busy samples"
    keep = [(k, v) for k, v in inclusive.most_common() if re.search(
        r"^(app|heatmaps|figures|loaders|summary|trace|tracing|state|encoder|modeling_bert|_json|json|"
        r"basedatatypes|plotly_chart|forward_msg|websocket|app_session|script_runner|exec_code|"
        r"delta_generator|protobuf|module)\.py", k)]
    lines = [f"{100 * v / total:5.1f}%  {k}" for k, v in keep[:top]]
    return f"{total} busy samples at 50 Hz (inclusive share, busiest first):\n" + "\n".join(lines)


class BrowserProfile:
    """The page's JavaScript CPU profile (Chrome DevTools protocol) over the head changes it is started around."""

    def __init__(self, page, path: Path) -> None:
        self.cdp = page.context.new_cdp_session(page)
        self.cdp.send("Profiler.enable")
        self.cdp.send("Profiler.setSamplingInterval", {"interval": 200})  # microseconds
        self.path, self.profiles = path, []

    def start(self) -> None:
        self.cdp.send("Profiler.start")

    def stop(self) -> None:
        self.profiles.append(self.cdp.send("Profiler.stop")["profile"])

    def save_and_summarise(self, top: int = 25) -> str:
        """Write the profiles (open them in Chrome DevTools' Performance panel) and sum them up per change."""
        import collections
        import json

        self.path.write_text(json.dumps(self.profiles[-1] if len(self.profiles) == 1 else self.profiles))
        inclusive: collections.Counter = collections.Counter()
        total = 0.0
        for prof in self.profiles:
            nodes = {nd["id"]: nd for nd in prof["nodes"]}
            parent = {c: nd["id"] for nd in prof["nodes"] for c in nd.get("children", [])}
            spent: collections.Counter = collections.Counter()
            for sample, delta in zip(prof["samples"], prof["timeDeltas"][1:] + [0]):
                spent[sample] += delta
            for sample, us in spent.items():
                total += us
                seen, node = set(), sample
                while node is not None:
                    frame = nodes[node]["callFrame"]
                    script = frame["url"].rsplit("/", 1)[-1].split(".")[0]
                    name = (f"{frame['functionName'] or '(anonymous)'} "
                            f"{script}:{frame['lineNumber']}:{frame['columnNumber']}")
                    if name not in seen:
                        seen.add(name)
                        inclusive[name] += us
                    node = parent.get(node)
        n = max(1, len(self.profiles))
        lines = [f"{v / 1000 / n:7.1f} ms  {k}" for k, v in inclusive.most_common(top)]
        return (f"{n} head change(s), {total / 1000 / n:.0f} ms sampled each (from the click to the paint); "
                f"inclusive time per change, minified names (file:line:column):\n" + "\n".join(lines))
