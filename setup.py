"""Build hook: the wheel carries bertviz's JavaScript (require.js, d3, jQuery) as package data.

The files come from npm, pinned by package-lock.json (scripts/install_assets.sh puts them in
attention_explorer/views/vendor/). A build that finds them missing runs that script first, and
stops with what to do if it cannot, so no wheel ships views that draw nothing.
"""

import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
VENDOR = ROOT / "attention_explorer" / "views" / "vendor"
FILES = ("require.js", "d3v3.min.js", "d3v5.min.js", "jquery.min.js")


class BuildWithAssets(build_py):
    def run(self) -> None:
        if not all((VENDOR / name).is_file() for name in FILES):
            script = ROOT / "scripts" / "install_assets.sh"
            if subprocess.run(["bash", str(script)], cwd=ROOT, check=False).returncode != 0:
                raise SystemExit("bertviz's JavaScript is missing from attention_explorer/views/vendor/ and "
                                 "scripts/install_assets.sh could not fetch it: install Node.js and npm "
                                 "(Debian: apt-get install nodejs npm) and build again.")
        super().run()


setup(cmdclass={"build_py": BuildWithAssets})
