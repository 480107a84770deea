"""The installed streamapp version (``streamapp --version``, ``/openapi.json``)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def streamapp_version() -> str:
    try:
        return version("streamapp")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "0+unknown"
