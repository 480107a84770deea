"""Every code block of README.md and docs/*.md is checked, and every link resolves.

Python blocks run as written (a block that defines ``async def test_*`` functions has
them run too) and pass ``mypy --strict``; shell blocks that run ``streamapp`` name only
commands and options the CLI has; links to files or anchors point at something that
exists. The README's own promises (its examples' results, the install lines) are in
test_readme.py.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import re
import shlex
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import click
import pytest

from streamapp.cli import main as cli_main
from streamapp.settings.settings import Settings
from tests.support.waits import run_watched

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
SHELLS = ("sh", "bash", "shell", "console")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    code: str

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of ``page``, with the line their code starts on."""
    text = page.read_text()
    return [
        Block(page, text.count("\n", 0, m.start(2)) + 1, m.group(1), m.group(2))
        for m in FENCE.finditer(text)
    ]


ALL = [b for page in PAGES for b in blocks(page)]
PYTHON = [b for b in ALL if b.lang == "python"]
SHELL = [b for b in ALL if b.lang in SHELLS]


def test_every_block_says_its_language() -> None:
    """A block without a language would be checked by nothing."""
    assert [str(b) for b in ALL if not b.lang] == []


def test_the_docs_pages_exist() -> None:
    names = {p.name for p in PAGES}
    for name in (
        "concepts.md",
        "failures.md",
        "composition.md",
        "catchup.md",
        "views.md",
        "rabbitmq.md",
        "testing.md",
        "settings.md",
        "performance.md",
        "architecture.md",
    ):
        assert name in names


def test_the_readme_is_short() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) < 250


# ---- python blocks ----------------------------------------------------------------


@pytest.mark.parametrize("block", PYTHON, ids=str)
def test_python_block_runs(block: Block) -> None:
    namespace: dict[str, Any] = {"__name__": f"doc_block_{block.line}"}
    exec(compile("\n" * (block.line - 1) + block.code, str(block.page), "exec"), namespace)
    for name, value in list(namespace.items()):
        if name.startswith("test_") and inspect.iscoroutinefunction(value):
            asyncio.run(value())


def test_python_blocks_pass_mypy_strict(tmp_path: Path) -> None:
    files = {}
    for i, block in enumerate(PYTHON):
        path = tmp_path / f"doc_block_{i:03d}.py"
        path.write_text("\n" * (block.line - 1) + block.code)  # mypy's lines are the page's
        files[str(path)] = str(block.page.relative_to(ROOT))
    out = run_watched(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", *files],
        cwd=ROOT,  # the project's mypy settings; agents/ and tables/ importable
        env=dict(os.environ, MYPYPATH=str(ROOT)),
    )
    report = out.stdout + out.stderr
    for name, where in files.items():
        report = report.replace(name, where)
    assert out.returncode == 0, report


# ---- shell blocks -----------------------------------------------------------------

ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def streamapp_commands(code: str) -> list[list[str]]:
    """The ``streamapp ...`` command lines of a shell block, each as its words.

    A command starts a line or follows ``&&``, ``||``, ``|``, ``;`` or ``&``, after any
    ``VAR=value`` words; comments are dropped.
    """
    found = []
    for raw in code.replace("\\\n", " ").splitlines():
        try:
            words = shlex.split(raw, comments=True)
        except ValueError:  # an unbalanced quote inside a heredoc's JSON, say
            continue
        command: list[str] = []
        for word in [*words, ";"]:
            if word in ("&&", "||", "|", ";", "&"):
                if command:
                    found.append(command)
                command = []
                continue
            if not command and ASSIGNMENT.match(word):
                continue
            command.append(word)
        found = [c for c in found if c[0] == "streamapp"]
    return found


def check_command(words: list[str]) -> list[str]:
    """What in ``streamapp WORDS...`` the CLI does not have (empty: all of it).

    An option must belong to the command it follows, as click parses it: the group's
    before its subcommand (``streamapp -A m worker``), the subcommand's after it.
    """
    problems = []
    command: click.Command = cli_main
    args = iter(words[1:])
    for word in args:
        if word.startswith("-"):
            name = word.split("=", 1)[0]
            param = next((p for p in command.params if name in p.opts), None)
            if param is None and name != "--help":
                problems.append(f"{' '.join(words)}: no option {name} of {command.name}")
            takes_value = isinstance(param, click.Option) and not param.is_flag
            if takes_value and "=" not in word:
                next(args, None)
            continue
        if isinstance(command, click.Group) and word in command.commands:
            command = command.commands[word]
            continue
        if isinstance(command, click.Group) and not command.invoke_without_command:
            problems.append(f"{' '.join(words)}: no command {word!r} of {command.name}")
            break
    if isinstance(command, click.Group) and not command.invoke_without_command:
        problems.append(f"{' '.join(words)}: {command.name} needs a command")
    return problems


def test_the_docs_name_streamapp_commands() -> None:
    assert sum(len(streamapp_commands(b.code)) for b in SHELL) >= 10


@pytest.mark.parametrize("block", SHELL, ids=str)
def test_shell_block_names_commands_and_options_the_cli_has(block: Block) -> None:
    problems = [p for words in streamapp_commands(block.code) for p in check_command(words)]
    assert problems == [], f"{block}: {problems}"


def test_the_command_check_catches_what_the_cli_lacks() -> None:
    assert check_command(["streamapp", "worker", "-A", "m:app", "--web-port", "1"]) == []
    assert check_command(["streamapp", "-A", "m", "tables", "get", "t", "k", "--meta"]) == []
    assert check_command(["streamapp", "store", "read", "--from", "3"]) == []
    assert check_command(["streamapp", "worker", "--web-prot", "1"]) != []
    assert check_command(["streamapp", "topics", "delete", "-A", "m"]) != []
    assert check_command(["streamapp", "store"]) != []
    assert check_command(["streamapp", "worker", "-A", "m", "--version"]) != []
    assert streamapp_commands("X=1 streamapp worker -A m &  # run\ncd streamapp && ls") == [
        ["streamapp", "worker", "-A", "m"]
    ]


# ---- links ------------------------------------------------------------------------

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of the headings of ``page``."""
    text = FENCE.sub("", page.read_text())
    out: set[str] = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n, candidate = 0, slug
        while candidate in out:
            n += 1
            candidate = f"{slug}-{n}"
        out.add(candidate)
    return out


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    text = FENCE.sub("", page.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {file.relative_to(root)}")
        elif anchor and (file.suffix != ".md" or anchor not in anchors(file)):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(root)}")
    return broken


RESULTS = sorted((ROOT / "bench" / "results").glob("*.md"))
"""The write-ups of past bench runs: their links are checked too."""


@pytest.mark.parametrize("page", PAGES + RESULTS, ids=lambda p: p.name)
def test_links_resolve(page: Path) -> None:
    assert broken_links(page) == []


def test_the_link_check_catches_missing_files_and_anchors(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other page\n## A `code` heading, too\n")
    page.write_text(
        "# Here\n[ok](other.md#a-code-heading-too) [ok](#here) [ok](https://x.org/#y)\n"
        "[bad](missing.md) [bad](other.md#nowhere) [bad](#elsewhere)\n"
    )
    found = broken_links(page, root=tmp_path)
    assert [b.split(":")[0] for b in found] == ["missing.md", "other.md#nowhere", "#elsewhere"]


# ---- settings ---------------------------------------------------------------------


def documented_settings(text: str) -> set[str]:
    """The names in the first column of the settings tables of ``text``."""
    firsts = (line.split("|")[1] for line in text.splitlines() if line.startswith("| `"))
    return {name for cell in firsts for name in re.findall(r"`([a-z_]+)`", cell)}


def test_every_setting_is_in_docs_settings() -> None:
    named = documented_settings((ROOT / "docs" / "settings.md").read_text())
    missing = [f.name for f in fields(Settings) if f.name not in named]
    assert missing == [], f"settings without a row in docs/settings.md: {missing}"
    unknown = sorted(named - {f.name for f in fields(Settings)})
    assert unknown == [], f"rows of docs/settings.md that are no setting: {unknown}"


def test_the_settings_check_reads_the_first_column() -> None:
    text = "| `a`, `b` | `1` | like `c` |\n| x | `d` | y |\nprose `e`\n"
    assert documented_settings(text) == {"a", "b"}


# ---- names the docs give ------------------------------------------------------------

PATH = re.compile(r"`((?:streamapp|tests|bench|scripts|agents)/[\w./-]*)`")
SOURCE = "\n".join(p.read_text() for p in (ROOT / "streamapp").rglob("*.py"))
IGNORED = ("bench/.cache",)
"""Paths the docs name that a run makes (ignored by git)."""


def test_paths_named_in_the_docs_exist() -> None:
    missing = [
        f"{page.relative_to(ROOT)}: {path}"
        for page in PAGES
        for path in PATH.findall(page.read_text())
        if not (ROOT / path).exists() and not path.startswith(IGNORED)
    ]
    assert missing == []


def in_the_code(name: str) -> bool:
    """``name`` is in streamapp's source, whole or as an f-string prefix and a quoted
    suffix (``f"streamapp_forwarder_{name}"`` with ``"lag_events"``)."""
    if name in SOURCE or name.removesuffix("_total") in SOURCE:
        return True
    cuts = [i for i, c in enumerate(name) if c == "_"]
    return any(f'f"{name[: i + 1]}{{' in SOURCE and f'"{name[i + 1 :]}"' in SOURCE for i in cuts)


def test_metric_and_table_names_in_the_docs_are_in_the_code() -> None:
    """``streamapp_*`` names (metrics, the store's tables) are the code's own."""
    unknown = sorted(
        {
            name
            for page in PAGES
            for name in re.findall(r"\b(streamapp_[a-z_]+[a-z])", page.read_text())
            if not in_the_code(name)
        }
    )
    assert unknown == []


def test_the_name_check_reads_prefixes() -> None:
    assert in_the_code("streamapp_forwarder_lag_events")
    assert not in_the_code("streamapp_forwarder_lag_eventz")
    assert not in_the_code("streamapp_no_such_metric_total")
