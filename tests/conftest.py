"""Session-wide fixtures: where the real services are.

Order of choice: addresses given by the environment (STREAMAPP_KAFKA_BOOTSTRAP,
STREAMAPP_AMQP_URL, STREAMAPP_POSTGRES_DSN); testcontainers when a Docker engine
answers; otherwise the local services of ``scripts/services`` (started if needed).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@dataclass(frozen=True)
class Services:
    kafka: str
    amqp: str
    postgres: str
    how: str


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
    return Services(*(os.environ[n] for n in names), how="environment")


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
    ports = {"kafka": 9092, "rabbitmq": 5672, "postgres": 5432}
    if not all(_answers("127.0.0.1", p) for p in ports.values()):
        subprocess.run([str(ROOT / "scripts" / "services"), "up"], check=True)
    yield Services(
        kafka="127.0.0.1:9092",
        amqp="amqp://guest:guest@127.0.0.1:5672/",
        postgres="postgresql://postgres@127.0.0.1:5432/streamapp",
        how="scripts/services",
    )


def _containers() -> Iterator[Services]:
    from testcontainers.kafka import KafkaContainer
    from testcontainers.postgres import PostgresContainer
    from testcontainers.rabbitmq import RabbitMqContainer

    with (
        KafkaContainer("apache/kafka:4.1.2").with_kraft() as kafka,
        RabbitMqContainer("rabbitmq:4-management") as rabbit,
        PostgresContainer("postgres:16", dbname="streamapp") as pg,
    ):
        amqp = (
            f"amqp://guest:guest@{rabbit.get_container_host_ip()}:{rabbit.get_exposed_port(5672)}/"
        )
        dsn = pg.get_connection_url().replace("+psycopg2", "")
        yield Services(kafka.get_bootstrap_server(), amqp, dsn, how="testcontainers")


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
