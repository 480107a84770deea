"""Session-wide fixtures: where the real services are.

Order of choice: addresses given by the environment (STREAMAPP_KAFKA_BOOTSTRAP,
STREAMAPP_AMQP_URL, STREAMAPP_POSTGRES_DSN); testcontainers when a Docker engine
answers; otherwise the local services of ``scripts/services`` (started if needed).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


SKIPS_ALLOWED: dict[str, str] = {}
"""Tests allowed to skip (or xfail), by node id, each with its reason: none. A test that
skips where the services run reports a guarantee as checked when it was not."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A skipped (or xfailed) test fails, naming why it skipped: restart the service or
    fail naming what is missing, never skip (``SKIPS_ALLOWED`` lists the exceptions)."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if not report.skipped or item.nodeid in SKIPS_ALLOWED:
        return
    why = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = (
        f"{item.nodeid} skipped ({why}): no test of this suite may skip. Restart or start "
        "what it needs, or fail naming what is missing; an exception goes into "
        "SKIPS_ALLOWED in tests/conftest.py with its reason."
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With pytest-xdist (``scripts/test``: ``--dist loadgroup``) a file's tests run in
    one process, in order, and the files marked ``heavy`` (several workers under a large
    load each) one after another in one process, beside the others, never two at once.

    First among the hooks: xdist's worker reads the ``xdist_group`` marks in its own
    ``pytest_collection_modifyitems`` (it names each test by its group); run after it,
    the marks would be added too late and every test scheduled on its own."""
    for item in items:
        heavy = item.get_closest_marker("heavy") is not None
        item.add_marker(pytest.mark.xdist_group("heavy" if heavy else str(item.path)))


def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """With ``--dist loadgroup``: stop the run unless every test a worker collected
    carries its group (xdist names it ``<test>@<group>``). The grouping fails silently
    otherwise (pytest 9.2 with pytest-xdist 3.8: pytest-xdist#1386), and then a file's
    tests run on several workers at once and the heavy files beside each other."""
    if node.config.getvalue("dist") != "loadgroup":
        return
    ungrouped = [nodeid for nodeid in ids if "@" not in nodeid]
    if ungrouped:
        pytest.exit(
            f"--dist loadgroup: {len(ungrouped)} tests lost their xdist_group (first: "
            f"{ungrouped[0]}); pytest {pytest.__version__} with this pytest-xdist drops "
            "the grouping (pytest-xdist#1386): install the versions of constraints.txt",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )


@pytest.fixture(autouse=True)
def no_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves non-daemon threads running after it, or (async tests)
    asyncio tasks pending after it and its fixtures: :mod:`tests.support.leaks`."""
    from tests.support.leaks import running_threads

    if inspect.iscoroutinefunction(getattr(request, "function", None)):
        request.getfixturevalue("no_task_leaks")  # checks both, in the test's loop
        yield
        return
    threads = set(threading.enumerate())
    yield
    left = running_threads(threads)
    assert not left, f"{request.node.nodeid} left threads running: {', '.join(left)}"


@pytest.fixture
async def no_task_leaks(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """The async test's leak check, torn down after its other fixtures (set up first):
    tasks pending, then threads once the loop's own (asyncio.to_thread) ended."""
    from tests.support.leaks import pending_tasks, running_threads

    before, threads = set(asyncio.all_tasks()), set(threading.enumerate())
    yield
    left = await pending_tasks(before)
    assert not left, f"{request.node.nodeid} left asyncio tasks pending: {', '.join(left)}"
    await asyncio.get_running_loop().shutdown_default_executor()  # as asyncio.run does
    running = running_threads(threads)
    assert not running, f"{request.node.nodeid} left threads running: {', '.join(running)}"


@dataclass(frozen=True)
class Services:
    kafka: str
    amqp: str
    postgres: str
    how: str
    containers: dict[str, Any] = field(default_factory=dict)
    """testcontainers: the container of each service, by name (restarts stop and start
    them: ``tests/support/services.py``)."""


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def _docker_answers() -> bool:
    """True when a Docker engine answers /_ping on its unix socket (or DOCKER_HOST is set)."""
    if os.environ.get("DOCKER_HOST"):
        return True
    path = "/var/run/docker.sock"
    if not os.path.exists(path):
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(2)
            sock.connect(path)
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            return b" 200 " in sock.recv(64)
    except OSError:
        return False


def _from_env() -> Services | None:
    names = ("STREAMAPP_KAFKA_BOOTSTRAP", "STREAMAPP_AMQP_URL", "STREAMAPP_POSTGRES_DSN")
    if not all(os.environ.get(n) for n in names):
        return None
    kafka, amqp, postgres = (os.environ[n] for n in names)
    return Services(kafka, amqp, postgres, how="environment")


@pytest.fixture(scope="session")
def services() -> Iterator[Services]:
    """The real Kafka, RabbitMQ and PostgreSQL of this test session."""
    found = _from_env()
    if found is not None:
        yield found
        return
    if _docker_answers():
        yield from _containers()
        return
    ports = local_ports()
    if not all(_answers("127.0.0.1", p) for p in ports.values()):
        subprocess.run([str(ROOT / "scripts" / "services"), "up"], check=True)
    yield Services(
        kafka=f"127.0.0.1:{ports['kafka']}",
        amqp=f"amqp://guest:guest@127.0.0.1:{ports['rabbitmq']}/",
        postgres=f"postgresql://postgres@127.0.0.1:{ports['postgres']}/streamapp",
        how="scripts/services",
    )


def local_ports() -> dict[str, int]:
    """The ports of the local services, as ``scripts/services`` reads them
    (STREAMAPP_{KAFKA,RABBITMQ,POSTGRES}_PORT; its cache folder is STREAMAPP_SERVICES_HOME,
    which ``harness.restart_service`` passes on): e.g. a second PostgreSQL on 5433 to
    restart while Kafka and RabbitMQ stay the shared ones."""
    defaults = {"kafka": 9092, "rabbitmq": 5672, "postgres": 5432}
    return {
        name: int(os.environ.get(f"STREAMAPP_{name.upper()}_PORT") or port)
        for name, port in defaults.items()
    }


def _containers() -> Iterator[Services]:
    from testcontainers.kafka import KafkaContainer
    from testcontainers.postgres import PostgresContainer
    from testcontainers.rabbitmq import RabbitMqContainer

    # Host ports bound, not ephemeral: a container stopped and started again (the restart
    # tests) keeps its address, which Kafka also advertises.
    with (
        KafkaContainer("apache/kafka:4.1.2").with_kraft().with_bind_ports(9093, _free()) as kafka,
        RabbitMqContainer("rabbitmq:4-management").with_bind_ports(5672, _free()) as rabbit,
        PostgresContainer("postgres:16", dbname="streamapp").with_bind_ports(5432, _free()) as pg,
    ):
        amqp = (
            f"amqp://guest:guest@{rabbit.get_container_host_ip()}:{rabbit.get_exposed_port(5672)}/"
        )
        dsn = pg.get_connection_url().replace("+psycopg2", "")
        containers = {"kafka": kafka, "rabbitmq": rabbit, "postgres": pg}
        yield Services(kafka.get_bootstrap_server(), amqp, dsn, "testcontainers", containers)


def _free() -> int:
    """A free TCP port of this host."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="session")
def kafka_bootstrap(services: Services) -> str:
    return services.kafka


PgUrlFactory = Callable[[], contextlib.AbstractAsyncContextManager[str]]


@pytest.fixture
def pg_url_factory(services: Services) -> PgUrlFactory:
    """A fresh PostgreSQL schema per use, as an event-store URL (``search_path``)."""

    @contextlib.asynccontextmanager
    async def make() -> AsyncIterator[str]:
        import psycopg

        schema = f"es_{uuid.uuid4().hex[:10]}"
        dsn = services.postgres
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(f"CREATE SCHEMA {schema}")
        sep = "&" if "?" in dsn else "?"
        try:
            yield f"{dsn}{sep}options={quote(f'-csearch_path={schema}')}"
        finally:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                await conn.execute(f"DROP SCHEMA {schema} CASCADE")

    return make
