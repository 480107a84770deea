"""The worker's page in headless Chromium (Debian's ``chromium``): a key looked up from the
URL shows the owner's value; a screenshot is saved under the test artifacts directory."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path

import aiohttp
import pytest

from streamapp import Event
from tests.support.waits import run_watched

from .harness import ROOT, WorkerProc, create_topics, produce, wait_caught_up

pytestmark = [pytest.mark.integration]

ARTIFACTS = Path(os.environ.get("STREAMAPP_TEST_ARTIFACTS", ROOT / "test-artifacts"))


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium, installed with apt-get when missing (as scripts/test does)."""
    path = shutil.which("chromium")
    if path is None:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        apt = ["apt-get", "-o", "DPkg::Lock::Timeout=600"]  # waits for another apt-get
        subprocess.run([*apt, "update", "-qq"], check=True, env=env, timeout=600)
        subprocess.run(
            [*apt, "install", "-y", "-qq", "chromium"], check=True, env=env, timeout=1200
        )
        path = shutil.which("chromium")
    assert path is not None, "chromium is not installed and apt-get could not install it"
    return path


def _fresh_artifact(name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    path.unlink(missing_ok=True)
    return path


def _run_chromium(chromium: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_watched(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=15000",
            *args,
        ]
    )


async def test_page_looks_up_a_key_in_headless_chromium(
    kafka_bootstrap: str, tmp_path: Path, chromium: str
) -> None:
    ns = f"page{uuid.uuid4().hex[:6]}-"
    topic = f"{ns}orders"
    create_topics(kafka_bootstrap, ns)
    events = [Event.create("order.placed", stream_id=f"order-{i}", data={}) for i in range(50)]
    events.append(Event.create("order.shipped", stream_id="order-7", data={}))
    await produce(kafka_bootstrap, topic, events)
    token = f"tok-{uuid.uuid4().hex}"
    w = WorkerProc(
        kafka_bootstrap, ns, tmp_path / "w", tmp_path / "w.log",
        extra_env={"STREAMAPP_WEB_TOKEN": token},
    ).start()  # fmt: skip
    try:
        await wait_caught_up(kafka_bootstrap, topic, topic, 90, [w])
        base = f"http://127.0.0.1:{w.port}"
        auth = {"Authorization": f"Bearer {token}"}
        async with (
            aiohttp.ClientSession(headers=auth) as http,
            http.get(f"{base}/tables/order_status/order-7") as r,
        ):
            assert r.status == 200
            expected = await r.json()
        assert expected["status"] == "shipped"

        url = f"{base}/?table=order_status&key=order-7#token={token}"
        out = _run_chromium(chromium, tmp_path / "profile", "--dump-dom", url)
        assert out.returncode == 0, out.stderr[-2000:]
        dom = out.stdout
        m = re.search(r'<pre id="value" data-status="(\d+)">(.*?)</pre>', dom, re.S)
        assert m, dom[-3000:]
        assert m.group(1) == "200"
        assert json.loads(html.unescape(m.group(2))) == expected
        assert "order_status" in dom  # the tables list
        assert "this worker" in dom  # partitions with owner and phase
        assert re.search(r"<td>live</td>", dom)

        shot = _fresh_artifact("views-page.png")
        out = _run_chromium(
            chromium, tmp_path / "profile2", f"--screenshot={shot}", "--window-size=1200,1000", url
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert shot.stat().st_size > 5_000
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        assert w.stop() == 0
    assert token not in w.log_text()
