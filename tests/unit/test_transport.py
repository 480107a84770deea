"""The transport registry: one object per broker, picked by setting broker, imported only
when picked; the capability check; and no broker name compared anywhere else."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from streamapp import App, ConfigError, Event, Park, Retry, Send
from streamapp.failures.outcomes import FailurePolicy
from streamapp.settings.settings import BROKERS
from streamapp.testing import transport as memory
from streamapp.transports.base import Capabilities, refuse_unsupported, transports
from tests.support.waits import run_watched

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "streamapp"
REGISTRY = {
    PACKAGE / "transports" / "base.py",
    PACKAGE / "testing" / "transport.py",
    *(PACKAGE / "transports" / d / "transport.py" for d in ("kafka", "rabbitmq", "embedded")),
}
"""The only modules that may name a broker in a comparison."""


def _names_a_broker(node: ast.expr) -> bool:
    """``broker``, ``x.broker``, ``self.settings.broker`` (any name ending in broker)."""
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
    return isinstance(name, str) and name.endswith("broker")


def _literal(node: ast.expr) -> bool:
    """A string literal, or a tuple, list or set of them (``broker in ("kafka", ...)``)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_literal(e) for e in node.elts)
    return False


def broker_comparisons(source: str) -> list[int]:
    """Line numbers where ``source`` compares a broker to a literal (or matches one)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(map(_names_a_broker, operands)) and any(map(_literal, operands)):
                lines.append(node.lineno)
        elif isinstance(node, ast.Match) and _names_a_broker(node.subject):
            lines.append(node.lineno)
    return sorted(lines)


def test_the_walk_finds_each_form_of_broker_comparison() -> None:
    source = (
        'if settings.broker == "kafka": pass\n'
        'if broker != "none": pass\n'
        'if "rabbitmq" == self.settings.broker: pass\n'
        'if broker not in ("kafka", "rabbitmq"): pass\n'
        "match settings.broker:\n"
        '    case "kafka": pass\n'
        "if settings.broker in BROKERS: pass\n"  # validation against the names: allowed
        'if kind == "kafka": pass\n'  # not a broker
    )
    assert broker_comparisons(source) == [1, 2, 3, 4, 5]


def test_no_module_outside_the_registry_compares_the_broker_to_a_name() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path not in REGISTRY
        for line in broker_comparisons(path.read_text())
    ]
    assert found == [], f"ask the transport's capabilities instead: {found}"


def test_every_value_of_setting_broker_has_its_transport() -> None:
    assert tuple(transports) == BROKERS
    for name in BROKERS:
        assert transports[name].name == name


def test_an_unknown_broker_names_the_setting_and_the_choices() -> None:
    with pytest.raises(ConfigError) as err:
        transports["kafak"]
    message = str(err.value)
    assert "STREAMAPP_BROKER" in message
    assert "'kafak'" in message
    assert "kafka, rabbitmq, none" in message


def test_picking_kafka_imports_no_rabbitmq_client() -> None:
    code = (
        "import sys\n"
        "import streamapp.worker, streamapp.cli, streamapp.cli.reset\n"
        "from streamapp.transports.base import transports\n"
        "transports['kafka'].capabilities\n"
        "print(sorted(m for m in ('aio_pika', 'aiormq') if m in sys.modules))\n"
        "transports['none'].capabilities\n"
        "print('aiokafka' in sys.modules)\n"
    )
    out = run_watched([sys.executable, "-c", code], cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]", "True"]  # kafka's own client, and no other


def _failing(on_failure: FailurePolicy) -> App:
    app = App("caps")

    @app.agent(app.topic("orders", partitions=2), on_failure=on_failure)
    async def tally(event: Event) -> None:
        pass

    return app


def _rekeyed() -> App:
    app = App("caps")
    orders = app.topic("orders", partitions=2)

    @app.agent(orders, group_by=lambda e: str(e.data["customer"]))
    async def per_customer(event: Event) -> None:
        pass

    return app


def _sending() -> App:
    app = App("caps")
    orders, out = app.topic("orders", partitions=2), app.topic("out", partitions=2)

    @app.agent(orders, sinks=[out])
    async def copy(event: Event, *, send: Send) -> None:
        send(out, event)

    return app


NEEDS = {
    "group_by": (_rekeyed, "re-keyed"),
    "retry_chain": (lambda: _failing(Retry()), "on_failure=Retry(...)"),
    "sends": (_sending, "no broker to send them to"),
}


def _supports(capabilities: Capabilities, need: str) -> bool:
    if need == "group_by":
        return capabilities.group_by_refused is None
    supported: bool = getattr(capabilities, need)
    return supported


@pytest.mark.parametrize("need", sorted(NEEDS))
@pytest.mark.parametrize("broker", [*BROKERS, memory.NAME])
def test_the_capability_check_refuses_what_the_transport_lacks(broker: str, need: str) -> None:
    capabilities = memory.CAPABILITIES if broker == memory.NAME else transports[broker].capabilities
    make, words = NEEDS[need]
    app = make()
    if _supports(capabilities, need):
        refuse_unsupported(app, broker, capabilities)
        return
    with pytest.raises(ConfigError, match=f"STREAMAPP_BROKER\\) = '{broker}'") as err:
        refuse_unsupported(app, broker, capabilities)
    assert words in str(err.value)


def test_what_each_transport_can_run() -> None:
    """The capabilities the refusals' messages promise (``it runs on kafka, rabbitmq and
    the memory broker``; ``test it with the memory broker``)."""
    table = {name: transports[name].capabilities for name in BROKERS}
    table[memory.NAME] = memory.CAPABILITIES
    assert {n for n, c in table.items() if c.retry_chain} == {"kafka", "rabbitmq", "memory"}
    assert {n for n, c in table.items() if c.sends} == {"kafka", "rabbitmq", "memory"}
    assert {n for n, c in table.items() if c.group_by_refused is None} == {"kafka", "memory"}
    assert {n for n, c in table.items() if c.changelog} == {"kafka"}
    assert {n for n, c in table.items() if c.embedded} == {"none"}


def test_a_park_policy_runs_everywhere() -> None:
    app = _failing(Park("orders-parked"))
    for name in BROKERS:
        refuse_unsupported(app, name, transports[name].capabilities)
