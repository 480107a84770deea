"""Restart a service of the test session (Kafka, RabbitMQ, PostgreSQL), however it was
started: the restart tests never skip where the services run.

- ``scripts/services``: ``scripts/services down|up SERVICE`` (:func:`restart_service`);
- testcontainers: stop and start the container (its host port is bound, so the address
  stays the same: see ``tests/conftest.py``), then wait until the service answers;
- given by the environment: the instance of ``scripts/services`` named by
  ``STREAMAPP_SERVICES_HOME`` and ``STREAMAPP_<SERVICE>_PORT`` when
  ``STREAMAPP_TEST_RESTARTABLE=1`` says it is that one; otherwise the test fails, naming
  what to set (a restart test must not pass without restarting).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.support.waits import until_sync

if TYPE_CHECKING:
    from tests.conftest import Services

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("kafka", "rabbitmq", "postgres")
READY_S = 240.0
"""How long a restarted container may give the same non-answer (a loaded machine is slow)."""


def restart_service(action: str, service: str, env: dict[str, str] | None = None) -> None:
    """`scripts/services down|up SERVICE` for the restart tests; on failure, the script's
    own words are in the assertion (a loaded machine may need the longer readiness bound).

    The environment goes through: STREAMAPP_SERVICES_HOME and STREAMAPP_<SERVICE>_PORT
    pick the instance (the same that tests/conftest.py found), e.g. a PostgreSQL of one's
    own on 5433 while Kafka and RabbitMQ are shared."""
    env = {
        **os.environ,
        "STREAMAPP_KAFKA_TIMEOUT": "240",
        "STREAMAPP_RABBITMQ_TIMEOUT": "240",
        **(env or {}),
    }
    done = subprocess.run(
        [str(ROOT / "scripts" / "services"), action, service],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, (
        f"scripts/services {action} {service} exited {done.returncode}:\n"
        f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )


def restart(services: Services, action: str, service: str) -> None:
    """Take ``service`` of this session ``down`` or bring it ``up`` again, on the same
    address, whatever started it; ``up`` returns once it answers."""
    assert action in ("down", "up"), action
    assert service in SERVICES, service
    if services.how == "testcontainers":
        container = services.containers[service].get_wrapped_container()
        if action == "down":
            container.stop(timeout=30)
        else:
            container.start()
            _wait_answers(services, service)
    elif services.how == "scripts/services" or os.environ.get("STREAMAPP_TEST_RESTARTABLE"):
        restart_service(action, service)
    else:
        pytest.fail(
            f"this test restarts {service}, and this session's services come from "
            f"{services.how}, which it cannot restart. Run the tests against scripts/services "
            "or testcontainers (unset STREAMAPP_KAFKA_BOOTSTRAP, STREAMAPP_AMQP_URL and "
            "STREAMAPP_POSTGRES_DSN), or set STREAMAPP_TEST_RESTARTABLE=1 when "
            f"STREAMAPP_SERVICES_HOME and STREAMAPP_{service.upper()}_PORT name the "
            "scripts/services instance those variables point at"
        )


def _wait_answers(services: Services, service: str) -> None:
    """Until ``service`` answers its own protocol; fails once its answer (the probe's
    error: refused, then a protocol error, ...) stayed the same for READY_S."""
    last: list[BaseException | None] = [None]

    def answers() -> bool:
        try:
            _probe(services, service)
        except Exception as exc:  # not up yet
            last[0] = exc
            return False
        return True

    until_sync(
        answers,
        what=f"{service} answering after its start",
        progress=lambda: repr(last[0]),
        stalled_s=READY_S,
        poll_s=0.5,
    )


def _probe(services: Services, service: str) -> None:
    if service == "postgres":
        import psycopg

        with psycopg.connect(services.postgres, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    elif service == "rabbitmq":
        asyncio.run(_amqp(services.amqp))
    else:
        host, port = services.kafka.rsplit(":", 1)
        socket.create_connection((host, int(port)), timeout=2).close()
        asyncio.run(_kafka(services.kafka))


async def _amqp(url: str) -> None:
    import aio_pika

    connection = await aio_pika.connect(url, timeout=5)
    await connection.close()


async def _kafka(bootstrap: str) -> Any:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    await admin.start()
    try:
        return await admin.list_topics()
    finally:
        await admin.close()


@dataclass
class KafkaToRestart:
    """A Kafka broker a test may take down and bring up again (:func:`kafka_to_restart`)."""

    bootstrap: str
    services: Services
    env: dict[str, str] | None = None
    """``scripts/services``' environment for a broker of the test's own; None: the
    session's broker."""
    started: list[str] = field(default_factory=list)

    def down(self) -> None:
        if self.env is None:
            restart(self.services, "down", "kafka")
        else:
            restart_service("down", "kafka", self.env)

    def up(self) -> None:
        if self.env is None:
            restart(self.services, "up", "kafka")
        else:
            restart_service("up", "kafka", self.env)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def kafka_to_restart(services: Services, home: Path) -> Iterator[KafkaToRestart]:
    """With ``scripts/services``: a broker of the test's own (cache folder ``home``, free
    ports, the session's jars), stopped after; otherwise the session's broker. The
    session's broker holds every topic the suite made so far (thousands of partitions on
    a long-lived machine), which a stop and a start each load and flush: half a minute
    and more, measuring the broker's size, not the worker's ride through the outage."""
    if services.how != "scripts/services":
        yield KafkaToRestart(services.kafka, services)
        return
    shared = Path(
        os.environ.get("STREAMAPP_SERVICES_HOME") or Path.home() / ".cache/streamapp-services"
    )
    (home / "kafka").mkdir(parents=True)
    jars = shared / "kafka" / "libs"
    if jars.is_dir():  # resolved once by the session's start: no Maven run here
        (home / "kafka" / "libs").symlink_to(jars, target_is_directory=True)
    port = _free_port()
    env = {
        "STREAMAPP_SERVICES_HOME": str(home),
        "STREAMAPP_KAFKA_PORT": str(port),
        "STREAMAPP_KAFKA_CONTROLLER_PORT": str(_free_port()),
        "STREAMAPP_KAFKA_HEAP": "-Xmx512m -Xms128m",
    }
    broker = KafkaToRestart(f"127.0.0.1:{port}", services, env)
    restart_service("up", "kafka", env)
    try:
        yield broker
    finally:
        restart_service("down", "kafka", env)
