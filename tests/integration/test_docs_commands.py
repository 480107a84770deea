"""Every shell block of README.md and docs/*.md runs as written, and does what it says.

Each block runs through ``bash`` (``set -euo pipefail``) in its own process group, in a
scratch directory holding what a user would have there: a ``git clone`` of this
repository for the blocks that clone (``<this repository's URL>`` becomes the repository's
path: the one substitution, so the clone is of the committed HEAD), else copies of the
app modules ``agents/`` and ``tables/`` (or the page's own code, for a page whose
commands run the page's app). Environment only: the shared services' addresses, a unique
``ORDERS_NAMESPACE`` on the shared brokers, and ``PATH`` with this interpreter's ``bin``
so that ``streamapp`` resolves (a block that makes its own venv uses its own). A block
that needs a world before it (a worker running, records parked, two table versions) has
it prepared here with the real commands; then the results its comments promise are
checked. Whatever a block leaves running (``streamapp worker ... &``) is stopped with its
process group at the end.

The exceptions, each where its block is tested: ``make test`` (it runs this test: its
target is checked to be ``scripts/test``, which the suite's own run is) and ``make unit``
/ ``make lint`` (``scripts/test`` runs the same commands: their recipes are checked
against it), ``make demo`` (run in its own test, with ``STREAMAPP_KAFKA_BOOTSTRAP`` set
so that it uses the shared Kafka); a block of alternative ``streamapp worker`` lines
(each a foreground worker, docs/views.md) runs line by line, each until its worker is
ready, then Ctrl-C (SIGINT); a page's own app whose names are literal (composition's
``shop``) is saved with them namespaced; the blocks that name the orders app's topics
(``orders.parked``, ``orders-dlq``: docs/failures.md) run against the app without a
namespace, its old topics deleted first; the dead-letter copies ``dlq replay`` reads are
produced as the chain writes them (200 records through the default back-offs would take
hours). Installs run for real (``pip install -e .`` into a fresh venv takes ~15 s with
pip's cache, ``scripts/bootstrap dev`` ~20 s; minutes on a loaded machine).

The blocks that bind the docs' fixed ports (6066-6068) run one at a time on a machine:
the file holds a lock (``/tmp/streamapp-docs-commands.lock``) for its whole run, and a
port another process holds fails the test naming it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from streamapp import Event
from streamapp.codecs import kafka as kafka_codec
from tests.conftest import Services
from tests.integration.harness import produce
from tests.support.waits import Stalled, frozen, group_cpu, run_watched, until_exit, until_sync
from tests.unit.test_docs import PYTHON, SHELL, Block

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
"""The bin of the interpreter running the tests (the worktree's .venv): ``streamapp``."""
STALL_S = 120.0
"""A block, or a state a test waits for, fails when nothing moved (no output, no
progress) for this long."""
PORTS = (6066, 6067, 6068)

QUICK_START = ("README.md", "git clone <this repository's URL> streamapp && cd streamapp  ")
INSTALLING = ("README.md", "git clone <this repository's URL> streamapp && cd streamapp\n")
TWO_COMMANDS = ("README.md", "make demo")
README_KAFKA = ("README.md", "streamapp topics create -A agents.orders:app")
SUITE = ("docs/testing.md", "make test")
VIEWS_WORKERS = ("docs/views.md", "streamapp -A agents.orders worker -l info")
VIEWS_ASK = ("docs/views.md", "streamapp agents -A agents.orders")
VERSIONS_TOPICS = ("docs/changing-a-projection.md", "streamapp topics create -A agents.orders")
VERSIONS_WATCH = ("docs/changing-a-projection.md", "streamapp tables -A agents.orders")
VERSIONS_RETIRE = ("docs/changing-a-projection.md", "streamapp retire -A agents.orders order")
CATCHUP_RETIRE = ("docs/catchup.md", "streamapp retire -A agents.orders:app order_status")
RABBITMQ = ("docs/rabbitmq.md", "export STREAMAPP_BROKER=rabbitmq")
GROUP_BY = ("docs/composition.md", "streamapp topics create -A shop:app")
PARKED_REPLAY = ("docs/failures.md", "streamapp parked replay -A agents.orders:app")
DLQ_REPLAY = ("docs/failures.md", "streamapp dlq replay -A tracking:app")
CLAIMS = [
    QUICK_START,
    INSTALLING,
    TWO_COMMANDS,
    README_KAFKA,
    SUITE,
    VIEWS_WORKERS,
    VIEWS_ASK,
    VERSIONS_TOPICS,
    VERSIONS_WATCH,
    VERSIONS_RETIRE,
    CATCHUP_RETIRE,
    RABBITMQ,
    GROUP_BY,
    PARKED_REPLAY,
    DLQ_REPLAY,
]
"""(page, how its code starts): the shell blocks the tests below run, each once."""


def claimed(where: tuple[str, str]) -> list[Block]:
    page, first = where
    return [b for b in SHELL if str(b).startswith(f"{page}:") and b.code.startswith(first)]


def block(where: tuple[str, str]) -> Block:
    """The shell block of page ``where[0]`` whose code starts with ``where[1]``."""
    found = claimed(where)
    assert len(found) == 1, f"{where[0]}: {len(found)} shell blocks start with {where[1]!r}"
    return found[0]


def python_block(page: str, contains: str) -> str:
    found = [b.code for b in PYTHON if str(b).startswith(f"{page}:") and contains in b.code]
    assert len(found) == 1, f"{page}: {len(found)} python blocks contain {contains!r}"
    return found[0]


# ---- running a block -------------------------------------------------------------------


def user_env(*, venv: bool = True, **extra: str) -> dict[str, str]:
    """A user's environment: none of the suite's settings, ``streamapp`` on PATH
    (``venv``), plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("STREAMAPP_", "ORDERS_", "PYTEST", "COV_"))
        and k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
    }
    if venv:
        env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def group_members(pgid: int) -> list[int]:
    return list(group_cpu(pgid))


def stop_group(pgid: int) -> None:
    """SIGTERM the group, wait for it to end; SIGKILL what is left once its processes
    stood still (none ended, no CPU used) for a minute."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not group_members(pgid):
            return
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        with contextlib.suppress(Stalled):
            until_sync(
                lambda: not group_members(pgid),
                what=f"process group {pgid} ended",
                progress=lambda: frozen(group_cpu(pgid)),
                poll_s=0.2,
            )


@dataclass
class Ran:
    """A block that ran: its exit code and the group's output so far."""

    rc: int
    log: Path

    @property
    def out(self) -> str:
        return self.log.read_text(errors="replace")


def wait_for(
    what: str, done: Callable[[], bool], progress: Callable[[], object], stall_s: float = STALL_S
) -> None:
    """Poll ``done`` until true; fail when ``progress()`` gave nothing new for ``stall_s``
    (:func:`~tests.support.waits.until_sync`; its ``repr``: the observation may hold
    bytes or dicts)."""
    until_sync(done, what=what, progress=lambda: repr(progress()), stalled_s=stall_s, poll_s=0.25)


@contextmanager
def running(code: str, cwd: Path, env: dict[str, str], name: str = "block") -> Iterator[Ran]:
    """Run ``code`` as a bash script until it exits (failing when its group neither
    wrote output nor used CPU for STALL_S); yield its exit code and output while what it
    started in the background still runs; stop the whole group after."""
    script = cwd / f".{name}.sh"
    script.write_text("set -euo pipefail\n" + code)
    log = cwd / f".{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", str(script)],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        until_exit(  # progress: output, or CPU used by the group (a quiet pip install)
            proc,
            what=f"{name} in {cwd} exited",
            progress=lambda: (log.stat().st_size, frozen(group_cpu(proc.pid))),
            stalled_s=STALL_S,
            poll_s=0.25,
            detail=lambda: f"{code}\noutput:\n{log.read_text(errors='replace')[-3000:]}",
        )
        yield Ran(proc.wait(), log)
    finally:
        stop_group(proc.pid)
        proc.wait(timeout=10)


def run(code: str, cwd: Path, env: dict[str, str], name: str = "block") -> str:
    """Run ``code`` (see ``running``); it must exit 0; its output."""
    with running(code, cwd, env, name) as ran:
        assert ran.rc == 0, f"{name} exited {ran.rc}:\n{code}\noutput:\n{ran.out[-4000:]}"
        return ran.out


def exits(proc: subprocess.Popen[bytes], log: Path) -> int:
    """Until a stopped worker has exited: its exit code; fails, with its log's tail, once
    it neither exited nor logged for STALL_S (it logs each partition it closes)."""
    return until_exit(
        proc,
        what=f"worker (pid {proc.pid}) exited",
        progress=lambda: log.stat().st_size,
        stalled_s=STALL_S,
        detail=lambda: log.read_text(errors="replace")[-3000:],
    )


def http_get(url: str) -> tuple[int, bytes]:
    """GET ``url``: status and body (0 when nothing answers)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return int(r.status), bytes(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


@contextmanager
def worker(cwd: Path, env: dict[str, str], *args: str, port: int = 6066) -> Iterator[Path]:
    """A ``streamapp worker ARGS`` started as a user does, until its /readyz answers 200
    (progress: its log grows); stopped (SIGTERM, exit 0) after."""
    log = cwd / f".worker-{port}.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            ["streamapp", "worker", *args, "--web-port", str(port)],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:

        def ready() -> bool:
            assert proc.poll() is None, f"worker exited {proc.returncode}:\n{log.read_text()}"
            return http_get(f"http://127.0.0.1:{port}/readyz")[0] == 200

        wait_for(f"worker on :{port} ready", ready, lambda: log.stat().st_size)
        yield log
        proc.send_signal(signal.SIGTERM)
        assert exits(proc, log) == 0, log.read_text()[-3000:]
    finally:
        stop_group(proc.pid)
        proc.wait(timeout=10)


# ---- the scratch worlds ------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def docs_ports() -> Iterator[None]:
    """One run of this file at a time on the machine (the docs' ports are fixed)."""
    with open("/tmp/streamapp-docs-commands.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for port in PORTS:
            with socket.socket() as s:
                assert s.connect_ex(("127.0.0.1", port)) != 0, (
                    f"port {port} is taken by another process: the docs' commands use it"
                )
        yield


def app_dir(tmp_path: Path) -> Path:
    """A user's project directory holding copies of the repository's app modules."""
    for name in ("agents", "tables"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def quick_start_events(cwd: Path) -> Path:
    """``orders.jsonl`` as the README's quick start writes it (its heredoc)."""
    code = block(QUICK_START).code
    body = re.search(r"<<'JSON'\n(.*?)^JSON$", code, re.S | re.M)
    assert body is not None
    path = cwd / "orders.jsonl"
    path.write_text(body.group(1))
    return path


def clone(code: str) -> str:
    return code.replace("<this repository's URL>", str(ROOT))


def namespace() -> str:
    return f"docs-{uuid.uuid4().hex[:8]}-"


# ---- README ---------------------------------------------------------------------------


@pytest.mark.timeout(600)
def test_readme_quick_start(tmp_path: Path) -> None:
    """The embedded quick start from a clone: its own venv, 2 events appended, the view
    answers the order as paid with 2 events applied."""
    code = block(QUICK_START).code
    with running(clone(code), tmp_path, user_env(venv=False)) as ran:
        out = ran.out
        assert ran.rc == 0, out[-4000:]
    assert "appended 2 events; head position 2" in out
    assert re.search(r'\{"status":"paid","version":2,', out), out[-3000:]
    assert (tmp_path / "streamapp" / ".venv" / "bin" / "streamapp").exists()


@pytest.mark.acceptance  # make acceptance: too heavy for make test on two cores
@pytest.mark.timeout(600)
def test_readme_installing(tmp_path: Path) -> None:
    """The install lines from a clone: ``scripts/bootstrap dev`` makes the clone's .venv
    with the dev tools; ``pip install -e '.[postgres]'`` installs the clone into the
    user's own environment (a fresh venv here, activated), PostgreSQL driver included."""
    own = tmp_path / "own-env"
    made = run_watched([sys.executable, "-m", "venv", str(own)])
    assert made.returncode == 0, made.stdout + made.stderr
    env = user_env(venv=False, VIRTUAL_ENV=str(own))
    env["PATH"] = f"{own / 'bin'}{os.pathsep}{env['PATH']}"
    code = block(INSTALLING).code
    run(clone(code), tmp_path, env)
    repo = tmp_path / "streamapp"
    for tool in ("streamapp", "pytest", "mypy", "ruff"):
        assert (repo / ".venv" / "bin" / tool).exists(), tool
    found = run_watched(
        [
            str(own / "bin" / "python"),
            "-c",
            "import psycopg, streamapp.app as m; print(m.__file__)",
        ],
        cwd=own,
    )
    assert found.returncode == 0, found.stdout + found.stderr
    assert found.stdout.strip().startswith(str(repo)), found.stdout


def make_recipe(target: str) -> str:
    """The recipe of ``target`` in the Makefile, continuation lines joined."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    found = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", text, re.M)
    assert found is not None, f"no target {target} in the Makefile"
    return " ".join(found.group(1).split())


def test_make_test_and_the_other_make_targets() -> None:
    """``make test`` is the command that runs this test, so it is not run here: its
    recipe is ``scripts/test``, what the suite's run is. ``make unit`` and ``make lint``
    run what ``scripts/test`` runs (the same commands; the suite's own run is theirs)."""
    block(TWO_COMMANDS)
    block(SUITE)
    assert make_recipe("test") == "scripts/test"
    assert make_recipe("demo") == "scripts/demo"
    script = (ROOT / "scripts" / "test").read_text()
    lint = make_recipe("lint").removeprefix("scripts/bootstrap && ").split(" && ")
    assert lint == [
        ".venv/bin/ruff check .",
        ".venv/bin/ruff format --check .",
        ".venv/bin/mypy",
        ".venv/bin/lint-imports",
    ]
    for command in ["scripts/bootstrap dev", *lint]:
        assert re.search(rf"^{re.escape(command)}(\s|$)", script, re.M), command
    assert make_recipe("unit") == "scripts/bootstrap && .venv/bin/python -m pytest tests/unit -q"
    assert ".venv/bin/python -m pytest tests " in script  # tests/unit among them


@pytest.mark.acceptance  # .ci/run also runs make demo itself, before make test
@pytest.mark.timeout(900)
def test_make_demo(kafka_bootstrap: str) -> None:
    """``make demo`` on the shared Kafka: exit 0, every demo order printed with all its
    events applied, both processes stopped cleanly."""
    out = run_watched(
        ["make", "demo"],
        cwd=ROOT,
        env=user_env(venv=False, STREAMAPP_KAFKA_BOOTSTRAP=kafka_bootstrap),
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    lifecycles = {
        "demo-order-1": ("shipped", 3),
        "demo-order-2": ("cancelled", 2),
        "demo-order-3": ("paid", 2),
        "demo-order-4": ("placed", 1),
        "demo-order-5": ("shipped", 3),
    }
    for oid, (status, version) in lifecycles.items():
        assert re.search(
            rf"^{oid}: \{{'status': '{status}', 'version': {version},", out.stdout, re.M
        ), out.stdout[-3000:]
    assert "== worker stopped (exit 0)" in out.stdout
    assert "== forwarder stopped (exit 0)" in out.stdout


def test_readme_agent_on_kafka(tmp_path: Path, kafka_bootstrap: str) -> None:
    """The README's Kafka commands, with the quick start's ``orders.jsonl``: topics made,
    the history appended, a worker and the forwarder started, the view answers."""
    cwd = app_dir(tmp_path)
    quick_start_events(cwd)
    env = user_env(STREAMAPP_KAFKA_BOOTSTRAP=kafka_bootstrap, ORDERS_NAMESPACE=namespace())
    code = block(README_KAFKA).code
    out = run(code, cwd, env)
    ns = env["ORDERS_NAMESPACE"]
    assert re.search(rf"^{re.escape(ns)}orders\t.*\tcreated$", out, re.M), out[-3000:]
    assert "appended 2 events; head position 2" in out
    assert re.search(r'\{"status":"paid","version":2,', out), out[-3000:]


# ---- docs/views.md ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def embedded_orders(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, dict[str, str]]:
    """The orders app on the event store alone (as after the quick start): the quick
    start's events appended, with ``streamapp store append``."""
    cwd = app_dir(tmp_path_factory.mktemp("embedded-orders"))
    quick_start_events(cwd)
    env = user_env(STREAMAPP_BROKER="none")
    out = run("streamapp store append -A agents.orders:app orders.jsonl\n", cwd, env, "prepare")
    assert "appended 2 events" in out
    return cwd, env


def test_views_worker_commands(embedded_orders: tuple[Path, dict[str, str]]) -> None:
    """Each ``streamapp worker`` line (alternatives: each runs a worker in the
    foreground) runs alone until its worker is ready, then stops on SIGINT (Ctrl-C) with
    exit 0, logging as its options say."""
    cwd, env = embedded_orders
    code = block(VIEWS_WORKERS).code
    lines = [line for line in code.splitlines() if line.strip()]
    assert len(lines) == 3
    logs = []
    says_summary = [True, False, True]  # INFO, WARNING only, JSON INFO
    for i, line in enumerate(lines):
        log = cwd / f".worker-line-{i}.log"
        script = cwd / f".worker-line-{i}.sh"
        script.write_text(f"set -euo pipefail\n{line}\n")
        with log.open("wb") as out:
            proc = subprocess.Popen(
                ["bash", str(script)],
                cwd=cwd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            # ready, and (INFO) its partitions line said: the summary polls the phases
            wait_for(
                f"{line!r} ready",
                lambda log=log, says=says_summary[i]: (
                    http_get("http://127.0.0.1:6066/readyz")[0] == 200
                    and (not says or "owns 8 partitions" in log.read_text())
                ),
                lambda log=log, proc=proc: (log.stat().st_size, proc.poll()),
            )
            os.killpg(proc.pid, signal.SIGINT)
            assert exits(proc, log) == 0, log.read_text()[-3000:]
        finally:
            stop_group(proc.pid)
            proc.wait(timeout=10)
        logs.append(log.read_text())
    assert "owns 8 partitions" in logs[0], logs[0]
    assert " INFO " not in logs[1], logs[1]
    assert "owns 8 partitions" not in logs[1], logs[1]
    records = [json.loads(line) for line in logs[2].splitlines() if line.startswith("{")]
    assert any("owns 8 partitions" in str(r) for r in records), logs[2]


def test_views_commands_that_ask_a_worker(embedded_orders: tuple[Path, dict[str, str]]) -> None:
    """With a worker running: the app's agents and tables, the versions, the key and
    the scan, each as its comment says."""
    cwd, env = embedded_orders
    code = block(VIEWS_ASK).code
    with worker(cwd, env, "-A", "agents.orders:app"):
        out = run(code, cwd, env)
    assert re.search(r'^\{"agent":"project_order_status","topic":"orders",', out, re.M), out
    assert re.search(r"^order_status v1 active 8/8$", out, re.M), out
    assert re.search(r"^order_status\t8 partitions\tagent project_order_status\t", out, re.M)
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    versions = [v for v in lines if "state" in v]  # --json
    assert [(v["table"], v["version"], v["state"]) for v in versions] == [
        ("order_status", 1, "active")
    ], out
    meta = [m for m in lines if "phase" in m]  # get --meta
    assert [(m["key"], m["value"]["status"], m["value"]["version"]) for m in meta] == [
        ("order-17", "paid", 2)
    ], out
    scanned = [s for s in lines if "phase" not in s and "key" in s]  # scan
    assert [s["key"] for s in scanned] == ["order-17"], out


# ---- table versions: docs/changing-a-projection.md and docs/catchup.md ---------------------


def test_table_versions_watch_switch_and_retire(tmp_path: Path) -> None:
    """The page's v1+v2 app on the event store alone: ``topics create`` (nothing to
    create there), ``streamapp tables`` while v2 builds and once it is active; then v1's
    agent removed and the worker restarted, ``retire`` (dry run, then ``--yes``:
    docs/catchup.md) and the page's own ``retire --yes`` again (retired already: exit 0)."""
    page = "docs/changing-a-projection.md"
    both = python_block(page, 'Table("order_status", version=2)')
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "__init__.py").write_text("")
    (tmp_path / "agents" / "orders.py").write_text(both)
    quick_start_events(tmp_path)
    env = user_env(STREAMAPP_BROKER="none")
    run("streamapp store append -A agents.orders:app orders.jsonl\n", tmp_path, env, "prepare")
    out = run(block(VERSIONS_TOPICS).code, tmp_path, env)
    assert "nothing to create" in out, out
    watch = block(VERSIONS_WATCH).code
    with worker(tmp_path, env, "-A", "agents.orders"):
        seen: list[str] = []

        def v2_active() -> bool:
            seen.append(run(watch, tmp_path, env, "watch"))
            return re.search(r"^order_status v2 active 8/8$", seen[-1], re.M) is not None

        wait_for("v2 active", v2_active, lambda: seen[-1] if seen else "")
        assert re.search(r"^order_status v1 previous 8/8$", seen[-1], re.M), seen[-1]
    # v1's agent removed from the code (the page's next step), the worker restarted
    v2_only = re.sub(
        r'\n\n@app.agent\([^\n]*name="status_v1"\).*?(?=\n\n\n|\Z)', "", both, flags=re.S
    )
    assert "status_v1" not in v2_only.split("status_v1: Table")[1]
    (tmp_path / "agents" / "orders.py").write_text(v2_only)
    for cached in (tmp_path / "agents").rglob("__pycache__"):
        shutil.rmtree(cached)
    retire = block(CATCHUP_RETIRE).code
    again = block(VERSIONS_RETIRE).code
    with worker(tmp_path, env, "-A", "agents.orders"):
        out = run(retire, tmp_path, env, "retire")
        dry, _, done = out.partition("dry run: nothing changed; run again with --yes")
        assert done, out
        stores = re.findall(r"^  remove here: (\S+) \(8 partition store", dry, re.M)
        assert [Path(s).name for s in stores] == ["status_v1"], out
        assert re.search(r"^retired .*: every worker drops its local stores of it$", done, re.M)
        out = run(again, tmp_path, env, "again")
        assert "version 1 of app 'orders' is retired already" in out, out
        after = run(watch, tmp_path, env, "watch")
    assert not (tmp_path / stores[0]).exists(), stores
    assert re.search(r"^order_status v2 active 8/8$", after, re.M), after
    assert not re.search(r"^order_status v1 (active|previous)", after, re.M), after


# ---- docs/rabbitmq.md --------------------------------------------------------------------


def test_rabbitmq_commands(tmp_path: Path, services: Services) -> None:
    """The orders app on RabbitMQ: topology made, the forwarder and two workers started in
    the background; the workers share the 8 partitions and both answer the quick start's
    order (one from its own partition, the other forwarding to its owner)."""
    cwd = app_dir(tmp_path)
    env = user_env(STREAMAPP_AMQP_URL=services.amqp, ORDERS_NAMESPACE=namespace())
    events = quick_start_events(cwd)
    code = block(RABBITMQ).code
    with running(code, cwd, env) as ran:
        assert ran.rc == 0, ran.out[-4000:]
        append = (
            "STREAMAPP_BROKER=rabbitmq STREAMAPP_EVENT_STORE=sqlite:///orders.db "
            f"streamapp store append -A agents.orders:app {events.name}\n"
        )
        assert "appended 2 events" in run(append, cwd, env, "append")
        ports = [int(p) for p in re.findall(r"--web-port (\d+)", code)]
        assert len(ports) == 2

        def owned() -> list[int]:
            counts = []
            for port in ports:
                status, body = http_get(f"http://127.0.0.1:{port}/status")
                parts = json.loads(body).get("partitions") if status == 200 else {}
                assert parts is not None, f":{port} is no worker's: {body[:300]!r}\n{ran.out}"
                counts.append(len(parts) if status == 200 else -1)
            return counts

        def shared() -> bool:
            counts = owned()
            return sum(counts) == 8 and min(counts) > 0

        wait_for("two workers sharing 8 partitions", shared, lambda: (owned(), ran.out))
        for port in ports:
            url = f"http://127.0.0.1:{port}/tables/order_status/order-17"
            answers: list[tuple[int, bytes]] = []

            def paid(url: str = url, answers: list[tuple[int, bytes]] = answers) -> bool:
                answers.append(http_get(url))
                return answers[-1][0] == 200 and json.loads(answers[-1][1])["version"] == 2

            wait_for(f"{url} paid", paid, lambda a=answers: (len(ran.out), a[-1:]))
            assert json.loads(answers[-1][1])["status"] == "paid"


# ---- docs/composition.md ----------------------------------------------------------------


def test_group_by_commands(tmp_path: Path, kafka_bootstrap: str) -> None:
    """The page's ``group_by`` app as the user's ``shop.py`` (its app and topic names
    namespaced, the one change, for the shared Kafka): topics made (the repartition topic
    among them, as the comment shows), a worker running, order events of two customers
    produced; the block's ``curl`` answers cust-17's total."""
    ns = namespace()
    code = python_block("docs/composition.md", "group_by=lambda e")
    for name in ('App("shop")', 'app.topic("orders"'):
        assert code.count(name) == 1, name
    code = code.replace('App("shop")', f'App("{ns}shop")')
    code = code.replace('app.topic("orders"', f'app.topic("{ns}orders"')
    (tmp_path / "shop.py").write_text(code)
    env = user_env(STREAMAPP_KAFKA_BOOTSTRAP=kafka_bootstrap)
    run("streamapp topics create -A shop:app\n", tmp_path, env, "prepare")
    with worker(tmp_path, env, "-A", "shop:app"):
        events = [
            Event.create("order.placed", stream_id=f"order-{i}", source="docs", data=data)
            for i, data in enumerate(
                [
                    {"customer": "cust-17", "amount": 5},
                    {"customer": "cust-3", "amount": 100},
                    {"customer": "cust-17", "amount": 7},
                ]
            )
        ]
        asyncio.run(produce(kafka_bootstrap, f"{ns}orders", events))
        url = "http://127.0.0.1:6066/tables/totals/cust-17"
        answers: list[tuple[int, bytes]] = [(0, b"")]
        wait_for(
            "cust-17's total applied",
            lambda: answers.append(http_get(url)) or answers[-1] == (200, b"12"),
            lambda: (answers[-1], (tmp_path / ".worker-6066.log").stat().st_size),
        )
        out = run(block(GROUP_BY).code, tmp_path, env)
    rows = [line.split("\t") for line in out.splitlines() if "\t" in line]
    repartition = [r for r in rows if r[0] == f"{ns}shop-per_customer-repartition"]
    assert len(repartition) == 1, out
    assert repartition[0][1:3] == ["8 partitions", "repartition"], out
    assert out.rstrip().endswith("12"), out


# ---- docs/failures.md --------------------------------------------------------------------


async def _delete_topics(bootstrap: str, names: list[str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics(names)
    finally:
        await admin.close()


def orders_topics(bootstrap: str) -> list[str]:
    """The topics of the orders app without a namespace (and of the page's retry
    example, the same app id): ``orders``, ``orders.parked``, ``orders-...``."""
    return sorted(
        name
        for name in asyncio.run(_topics(bootstrap))
        if name == "orders" or name.startswith(("orders-", "orders."))
    )


async def _topics(bootstrap: str) -> list[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return list(await admin.list_topics())
    finally:
        await admin.close()


def _end_offsets(bootstrap: str, topic: str) -> int:
    """The records ``topic`` holds, over its partitions."""

    async def ends() -> int:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            (described,) = await admin.describe_topics([topic])
        finally:
            await admin.close()
        tps = [TopicPartition(topic, p["partition"]) for p in described["partitions"]]
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
        await consumer.start()
        await asyncio.sleep(0)  # its coordinator's first task started: stop() awaits it
        try:
            return sum((await consumer.end_offsets(tps)).values())
        finally:
            await consumer.stop()

    return asyncio.run(ends())


@pytest.fixture
def unprefixed_orders(kafka_bootstrap: str) -> str:
    """A Kafka world for the blocks that name the app's topics (``orders.parked``,
    ``orders-dlq``): the orders app as a user has it, without ORDERS_NAMESPACE. No
    other test uses those names (the file's lock keeps two runs of it apart); whatever an
    earlier run left on them is deleted first."""
    old = orders_topics(kafka_bootstrap)
    if old:
        asyncio.run(_delete_topics(kafka_bootstrap, old))
    left: list[list[str]] = [old]
    wait_for(  # a deleted topic's name is free again once it is out of the list
        "the orders app's old topics deleted",
        lambda: not left.append(orders_topics(kafka_bootstrap)) and not left[-1],
        lambda: left[-1],
    )
    return kafka_bootstrap


def test_parked_replay_commands(tmp_path: Path, unprefixed_orders: str) -> None:
    """Two records that are not CloudEvents, produced to ``orders``, parked by the
    worker; the dry run lists them and sends nothing; the run sends both back."""
    cwd = app_dir(tmp_path)
    env = user_env(STREAMAPP_KAFKA_BOOTSTRAP=unprefixed_orders)
    run("streamapp topics create -A agents.orders:app\n", cwd, env, "prepare")
    with worker(cwd, env, "-A", "agents.orders:app") as log:

        async def junk() -> None:
            producer = AIOKafkaProducer(bootstrap_servers=unprefixed_orders, acks="all")
            await producer.start()
            try:
                for key in (b"junk-1", b"junk-2"):
                    await producer.send_and_wait("orders", b"not a cloudevent", key=key)
            finally:
                await producer.stop()

        asyncio.run(junk())
        wait_for(
            "2 records parked",
            lambda: _end_offsets(unprefixed_orders, "orders.parked") == 2,
            lambda: log.stat().st_size,
        )
        out = run(block(PARKED_REPLAY).code, cwd, env)
    assert len(re.findall(r"^would send orders\.parked/\d+/\d+ to orders$", out, re.M)) == 2, out
    assert "dry run: would send 2 records back (orders: 2); nothing sent" in out
    assert "sent 2 records back to their origin topic (orders: 2)" in out
    assert _end_offsets(unprefixed_orders, "orders") == 4


def test_dlq_replay_command(tmp_path: Path, unprefixed_orders: str) -> None:
    """The retry chain's example as the user's ``tracking.py``, its topics made; its
    dead-letter topic holds 200 copies on partition 0 (produced here as the chain writes
    them, with ``x-origin-topic``: 200 records failing 17 times each through the
    default back-offs would take hours); the block sends offsets 120-199 back."""
    (tmp_path / "tracking.py").write_text(python_block("docs/failures.md", "on_failure=Retry("))
    env = user_env(STREAMAPP_KAFKA_BOOTSTRAP=unprefixed_orders)
    out = run("streamapp topics create -A tracking:app\n", tmp_path, env, "prepare")
    assert re.search(r"^orders-dlq\t", out, re.M), out

    async def dead_letters() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=unprefixed_orders, acks="all")
        await producer.start()
        try:
            for i in range(200):
                event = Event.create("order.placed", stream_id=f"order-{i}", source="docs")
                key, value, headers = kafka_codec.encode(event)
                headers = [*headers, ("x-origin-topic", b"orders")]
                await producer.send("orders-dlq", value, key=key, headers=headers, partition=0)
            await producer.flush()
        finally:
            await producer.stop()

    asyncio.run(dead_letters())
    out = run(block(DLQ_REPLAY).code, tmp_path, env)
    assert "sent 80 records back to their origin topic (orders: 80)" in out, out
    assert _end_offsets(unprefixed_orders, "orders") == 80


# ---- every block has its run -------------------------------------------------------------


def test_every_shell_block_runs_in_a_test_here() -> None:
    """A shell block added to the docs without a run here fails this."""
    runs = [str(b) for where in CLAIMS for b in claimed(where)]
    assert sorted(runs) == sorted(set(runs))
    assert sorted(str(b) for b in SHELL if str(b) not in runs) == []
