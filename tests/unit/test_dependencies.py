"""streamapp's runtime needs no CloudEvents SDK: it is a test dependency (interop tests)."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

from tests.support.waits import run_watched

ROOT = Path(__file__).resolve().parents[2]


def test_the_cloudevents_sdk_is_a_dev_dependency_only() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith("cloudevents") for d in project["dependencies"])
    assert any(d.startswith("cloudevents") for d in project["optional-dependencies"]["dev"])
    pinned = (ROOT / "constraints.txt").read_text().splitlines()
    assert any(line.startswith("cloudevents==") for line in pinned)  # CI's dev set


def test_every_streamapp_module_imports_without_the_sdk() -> None:
    code = (
        "import sys, importlib, pkgutil\n"
        "sys.modules['cloudevents'] = None  # any import of it raises ImportError\n"
        "import streamapp\n"
        "for m in pkgutil.walk_packages(streamapp.__path__, 'streamapp.'):\n"
        "    if m.name != 'streamapp.__main__':\n"
        "        importlib.import_module(m.name)\n"
        "print('ok')\n"
    )
    out = run_watched([sys.executable, "-c", code], cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
