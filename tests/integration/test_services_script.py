"""The promises of ``scripts/services``, checked against its real behaviour.

Every test runs the script with its own ``STREAMAPP_SERVICES_HOME`` (a pytest
tmp_path) and its own free loopback ports, so the shared services on the default
ports and the default cache folder are never touched.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.serial]  # its own services: run alone

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "services"
VAR_LIB = Path("/var/lib/streamapp-services")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def script_env(home: Path, **extra: str) -> dict[str, str]:
    # Nothing inherited from the caller may point the script at the shared services.
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMAPP_")}
    env["STREAMAPP_SERVICES_HOME"] = str(home)
    env.update(extra)
    return env


def run(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def processes_mentioning(*needles: str) -> list[str]:
    out = subprocess.run(
        ["ps", "-eo", "pid,args"], capture_output=True, text=True, timeout=10, check=True
    ).stdout
    return [line for line in out.splitlines()[1:] if any(n in line for n in needles)]


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    """A private cache folder; as root, also removes the data dir the script put under /var/lib."""
    yield tmp_path
    link = tmp_path / "postgres"
    if link.is_symlink():
        target = link.resolve()
        digest = hashlib.sha256(str(tmp_path).encode()).hexdigest()[:12]
        # Ours (never the shared one), and only once nothing runs from it any more.
        if target == VAR_LIB / digest / "postgres" and not processes_mentioning(str(target)):
            shutil.rmtree(target.parent, ignore_errors=True)


@pytest.mark.parametrize(
    ("service", "var"),
    [
        ("postgres", "STREAMAPP_POSTGRES_PORT"),
        ("kafka", "STREAMAPP_KAFKA_PORT"),
        ("rabbitmq", "STREAMAPP_RABBITMQ_PORT"),
    ],
)
def test_up_refuses_a_taken_port_and_says_how_to_override(
    home: Path, service: str, var: str
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run(script_env(home, **{var: str(port)}), "up", service, timeout=30)

    assert result.returncode != 0, result.stdout + result.stderr
    assert f"{service}: port 127.0.0.1:{port} is already in use" in result.stderr
    assert f"{var}={port + 100}" in result.stderr  # how to override
    assert f"up {service}" in result.stderr
    # reported in the preflight, before any start: no "<service>: starting" line, no process
    assert f"{service}: starting" not in result.stdout, result.stdout
    assert not processes_mentioning(str(home)), "nothing may have been started"


def test_postgres_lifecycle_on_its_own_port(home: Path) -> None:
    port = free_port()
    env = script_env(home, STREAMAPP_POSTGRES_PORT=str(port))
    data_dir: Path | None = None
    try:
        up = run(env, "up", "postgres", timeout=60)
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"postgres: ready on 127.0.0.1:{port}" in up.stdout
        dsn = f"postgresql://postgres@127.0.0.1:{port}/streamapp"
        assert f"STREAMAPP_POSTGRES_DSN={dsn}" in up.stdout
        data_dir = (home / "postgres").resolve() / "data"
        assert data_dir.is_dir()

        with psycopg.connect(dsn, connect_timeout=5) as conn:
            row = conn.execute("select current_database(), inet_server_port()").fetchone()
        assert row == ("streamapp", port)

        again = run(env, "up", "postgres", timeout=30)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "postgres: already running (pid " in again.stdout
        assert "postgres: starting" not in again.stdout  # found running, nothing started
        assert "initdb" not in again.stdout

        status = run(env, "status", "postgres", timeout=30)
        assert status.returncode == 0, status.stderr
        fields = status.stdout.split()
        assert fields[:3] == ["postgres", "running", "pid"], status.stdout
        pid = int(fields[3])
        assert f"127.0.0.1:{port}" in status.stdout
        assert f"(pid {pid})" in again.stdout
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        assert str(data_dir) in cmdline

        down = run(env, "down", "postgres", timeout=60)
        assert down.returncode == 0, down.stdout + down.stderr
        assert f"postgres: stopping (pid {pid})" in down.stdout

        assert not Path(f"/proc/{pid}").exists()
        assert not processes_mentioning(str(home), str(data_dir))
        assert not answers(port)
        after = run(env, "status", "postgres", timeout=30)
        assert after.stdout.split()[:2] == ["postgres", "stopped"], after.stdout
    finally:
        run(env, "down", "postgres", timeout=60)
    assert not processes_mentioning(str(home), str(data_dir))


def test_postgres_that_never_becomes_ready_is_named_with_its_log_tail(home: Path) -> None:
    """A cluster that cannot start: the script names postgres and shows its log."""
    port = free_port()
    env = script_env(home, STREAMAPP_POSTGRES_PORT=str(port), STREAMAPP_POSTGRES_TIMEOUT="10")
    # `status` resolves (as root: creates under /var/lib) the data folder and starts nothing.
    assert run(env, "status", "postgres", timeout=30).returncode == 0
    pg_dir = (home / "postgres").resolve()
    data_dir = pg_dir / "data"
    # A data dir that looks initialised (so initdb is skipped) but has no configuration:
    # the postmaster exits at once with a FATAL line in its log.
    data_dir.mkdir(mode=0o700, parents=True)
    (data_dir / "PG_VERSION").write_text("15\n")
    try:
        result = run(env, "up", "postgres", timeout=40)

        assert result.returncode != 0, result.stdout + result.stderr
        # the wait ended because the postmaster exited, not at the readiness bound
        assert "postgres: the server exited during start-up" in result.stderr
        assert "not ready on 127.0.0.1" not in result.stderr
        assert "not ready: postgres" in result.stderr  # says which service
        log = pg_dir / "log" / "postgres.log"
        assert f"----- last 40 lines of {log} -----" in result.stderr
        log_lines = [line for line in log.read_text().splitlines() if line.strip()]
        assert log_lines, "the postmaster wrote nothing to its log"
        assert log_lines[-1] in result.stderr  # the tail itself is shown
        assert "postgresql.conf" in result.stderr  # ...and it holds the reason
        assert not answers(port)
    finally:
        run(env, "down", "postgres", timeout=60)
    assert not processes_mentioning(str(home), str(data_dir))
