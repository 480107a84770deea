"""The ``streamapp`` command group, and what every command shares: ``-A`` (before or
after the command) loading the App, and ``--loglevel``."""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from pathlib import Path
from types import ModuleType

import click

from .._version import streamapp_version
from ..app import App
from ..errors import StreamappError


def load_app(ref: str) -> App:
    """Import ``MODULE[:ATTRIBUTE]`` (or ``path/to/file.py[:ATTRIBUTE]``) from the working
    tree and return the App it names (a bare module: its ``app``). Errors are one line
    naming what is missing and the form to give."""
    target, _, attr = ref.partition(":")
    attr = attr or "app"
    if not target:
        raise click.ClickException(f"-A {ref!r}: give MODULE[:ATTRIBUTE], e.g. agents.orders:app")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    module_name = _module_of(ref, target, attr)
    if "" in module_name.split("."):  # ".bank": importlib's relative import, a TypeError
        raise click.ClickException(
            f"-A {ref!r}: {module_name!r} is not a module name: give the option -A "
            "(--app) in the form module:attribute, an absolute dotted module name and "
            "the App's attribute, e.g. -A agents.orders:app"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.ClickException(f"-A {ref}: cannot import {module_name!r}: {exc}") from exc
    except StreamappError as exc:  # e.g. an agent refused at registration
        raise click.ClickException(f"-A {ref}: {exc}") from exc
    if not hasattr(module, attr):
        apps = [name for name, value in vars(module).items() if isinstance(value, App)]
        others = [
            n
            for n, v in vars(module).items()
            if n[0] != "_" and not isinstance(v, (type, ModuleType))
        ]
        named = apps or difflib.get_close_matches(attr, others, 3)
        hint = (
            f"did you mean {' or '.join(f'-A {module_name}:{n}' for n in named)}?"
            if named
            else "give MODULE:ATTRIBUTE naming the App"
        )
        raise click.ClickException(
            f"-A {ref}: module {module_name!r} has no attribute {attr!r} ({hint})"
        )
    app = getattr(module, attr)
    if not isinstance(app, App):
        raise click.ClickException(
            f"-A {ref}: {module_name}:{attr} is not a streamapp App (it is a {type(app).__name__})"
        )
    return app


def _module_of(ref: str, target: str, attr: str) -> str:
    """The module name of ``-A``'s MODULE part: a dotted name as given; a file path
    (``./bank.py``, ``agents/orders.py``) as the module it is, seen from the working
    directory (its folder goes on ``sys.path`` when it lies outside)."""
    if not (target.endswith(".py") or "/" in target or os.sep in target):
        return target
    path = Path(target)
    dotted = ".".join(path.with_suffix("").parts) if path.suffix == ".py" else target
    if not path.is_file():
        raise click.ClickException(
            f"-A {ref}: no file {target!r}; give the module's dotted name, e.g. "
            f"-A {dotted.strip('.').replace('/', '.')}:{attr}, from the directory it lies in"
        )
    path = path.resolve()
    try:
        inside = path.with_suffix("").relative_to(Path.cwd().resolve())
    except ValueError:
        sys.path.insert(0, str(path.parent))
        return path.stem
    return ".".join(inside.parts)


def _app_ref(ctx: click.Context, param: click.Parameter, value: str | None) -> str:
    """``-A`` given after the command, else before it (``streamapp -A MOD worker``, or
    after a group that takes it: ``streamapp store parked -A MOD replay``)."""
    ref, parent = value, ctx.parent
    while not ref and parent is not None:  # streamapp [-A MOD] GROUP [-A MOD] COMMAND
        ref, parent = parent.params.get("app_ref"), parent.parent
    if not ref:
        raise click.ClickException(
            f"{ctx.command_path}: give the app with -A MODULE[:ATTRIBUTE], e.g. -A agents.orders"
        )
    return str(ref)


app_option = click.option(
    "-A", "--app", "app_ref", callback=_app_ref, help="MODULE[:ATTRIBUTE] of the App."
)

LEVELS = ("debug", "info", "warning", "error", "critical")
LEVEL_ALIASES = {"warn": "warning", "fatal": "critical"}
"""The other names Python's logging gives these levels."""


def _level(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A level name in any case (``WARN``, ``Info``), Python's aliases included."""
    level = LEVEL_ALIASES.get(value.lower(), value.lower())
    if level not in LEVELS:
        raise click.ClickException(f"unknown log level {value!r}: use one of {', '.join(LEVELS)}")
    return level


loglevel_option = click.option(
    "-l", "--loglevel", default="info", show_default=True, callback=_level, help="Log level."
)


@click.group()
@click.option(
    "-A", "--app", "app_ref", help="MODULE[:ATTRIBUTE] of the App, for every command below."
)
@click.version_option(streamapp_version(), "--version", prog_name="streamapp")
def main(app_ref: str | None) -> None:
    """streamapp: event-sourced projections over Kafka with exactly-once table state."""
