"""Settings: defaults, environment parsing, validation rules, Backoff."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from streamapp import App, Backoff, ConfigError, Settings
from streamapp.settings.settings import NOT_SETTINGS


def test_defaults_are_valid() -> None:
    s = Settings(app_id="orders")
    assert s.group_id == "orders"
    assert s.enable_auto_commit is False
    assert s.auto_offset_reset == "earliest"
    assert s.batch_budget_ms * 2 <= s.rebalance_timeout_ms
    assert s.heartbeat_interval_ms < s.session_timeout_ms
    assert s.startup_retry == Backoff()


def test_from_env_with_empty_env_gives_defaults() -> None:
    assert Settings.from_env("orders", env={}) == Settings(app_id="orders")


def test_from_env_parses_ints_bools_floats_and_paths() -> None:
    env = {
        "STREAMAPP_WEB_PORT": "7070",
        "STREAMAPP_MAX_BATCH_RECORDS": "50",
        "STREAMAPP_ENABLE_AUTO_COMMIT": "off",
        "STREAMAPP_DATA_DIR": "/var/lib/streamapp",
        "STREAMAPP_PUBLISH_TIMEOUT_S": "2.5",
        "STREAMAPP_KAFKA_BOOTSTRAP": "kafka:29092",
        "STREAMAPP_AUTO_OFFSET_RESET": "latest",
        "OTHER_WEB_PORT": "1",
    }
    s = Settings.from_env("orders", env=env)
    assert s.web_port == 7070
    assert isinstance(s.web_port, int)
    assert s.max_batch_records == 50
    assert s.enable_auto_commit is False
    assert s.data_dir == Path("/var/lib/streamapp")
    assert isinstance(s.data_dir, Path)
    assert s.publish_timeout_s == 2.5
    assert s.kafka_bootstrap == "kafka:29092"
    assert s.auto_offset_reset == "latest"


def test_from_env_app_id_variable_does_not_override_argument() -> None:
    s = Settings.from_env("orders", env={"STREAMAPP_APP_ID": "other"})
    assert s.app_id == "orders"


def test_from_env_overrides_win_over_environment() -> None:
    s = Settings.from_env("orders", env={"STREAMAPP_WEB_PORT": "7070"}, web_port=8080)
    assert s.web_port == 8080


@pytest.mark.parametrize(
    ("var", "raw"),
    [
        ("STREAMAPP_WEB_PORT", "not-a-port"),
        ("STREAMAPP_POLL_TIMEOUT_MS", "1.5"),
        ("STREAMAPP_ENABLE_AUTO_COMMIT", "maybe"),
        ("STREAMAPP_PUBLISH_TIMEOUT_S", "soon"),
    ],
)
def test_from_env_parse_error_names_the_variable(var: str, raw: str) -> None:
    with pytest.raises(ConfigError, match=var) as info:
        Settings.from_env("orders", env={var: raw})
    assert repr(raw) in str(info.value)


def test_from_env_invalid_value_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="STREAMAPP_WEB_PORT"):
        Settings.from_env("orders", env={"STREAMAPP_WEB_PORT": "70000"})


@pytest.mark.parametrize("raw", ["true", "1", "yes", "ON"])
def test_enable_auto_commit_from_env_is_refused(raw: str) -> None:
    with pytest.raises(ConfigError, match="enable_auto_commit") as info:
        Settings.from_env("orders", env={"STREAMAPP_ENABLE_AUTO_COMMIT": raw})
    assert "STREAMAPP_ENABLE_AUTO_COMMIT" in str(info.value)


def test_enable_auto_commit_is_refused() -> None:
    with pytest.raises(ConfigError, match="enable_auto_commit"):
        Settings(app_id="orders", enable_auto_commit=True)


@pytest.mark.parametrize("app_id", ["", " ", "   ", "\t\n"])
def test_blank_app_id_is_refused(app_id: str) -> None:
    with pytest.raises(ConfigError, match="app_id"):
        Settings(app_id=app_id)


@pytest.mark.parametrize("app_id", [" orders", "orders ", "my orders"])
def test_app_id_with_whitespace_is_refused(app_id: str) -> None:
    with pytest.raises(ConfigError, match="app_id"):
        Settings(app_id=app_id)


def test_batch_budget_at_most_half_the_rebalance_timeout() -> None:
    ok = Settings(app_id="a", batch_budget_ms=30_000, rebalance_timeout_ms=60_000)
    assert ok.batch_budget_ms == 30_000
    with pytest.raises(ConfigError, match="batch_budget_ms") as info:
        Settings(app_id="a", batch_budget_ms=30_001, rebalance_timeout_ms=60_000)
    assert "rebalance_timeout_ms" in str(info.value)


def test_batch_budget_at_most_half_the_max_poll_interval() -> None:
    with pytest.raises(ConfigError, match="max_poll_interval_ms"):
        Settings(
            app_id="a",
            batch_budget_ms=20_000,
            rebalance_timeout_ms=100_000,
            max_poll_interval_ms=39_999,
        )


def test_heartbeat_below_session_timeout() -> None:
    assert Settings(app_id="a", heartbeat_interval_ms=9_999).heartbeat_interval_ms == 9_999
    for heartbeat in (10_000, 10_001):
        with pytest.raises(ConfigError, match="heartbeat_interval_ms") as info:
            Settings(app_id="a", heartbeat_interval_ms=heartbeat, session_timeout_ms=10_000)
        assert "session_timeout_ms" in str(info.value)


@pytest.mark.parametrize(
    "name",
    [
        "poll_timeout_ms",
        "max_batch_records",
        "replication_factor",
        "publish_timeout_s",
        "transaction_timeout_s",
    ],
)
def test_non_positive_values_are_refused(name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        Settings(app_id="a", **{name: 0})


def test_auto_offset_reset_values() -> None:
    with pytest.raises(ConfigError, match="auto_offset_reset"):
        Settings(app_id="a", auto_offset_reset="none")


def test_settings_is_frozen() -> None:
    s = Settings(app_id="orders")
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.web_port = 1  # type: ignore[misc]
    assert s.web_port == 6066


def test_with_returns_a_validated_copy() -> None:
    s = Settings(app_id="orders")
    t = s.with_(web_port=7000)
    assert (s.web_port, t.web_port) == (6066, 7000)
    with pytest.raises(ConfigError, match="enable_auto_commit"):
        s.with_(enable_auto_commit=True)


def test_backoff_delays() -> None:
    delays = Backoff().delays()
    assert len(delays) == 9
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0, 2.0])
    assert max(delays) == 2.0


def test_backoff_edge_cases() -> None:
    assert Backoff(attempts=1).delays() == []
    assert Backoff(attempts=3, initial_s=1.0, max_s=1.5).delays() == [1.0, 1.5]
    with pytest.raises(ConfigError, match="startup_retry"):
        Settings(app_id="a", startup_retry=Backoff(attempts=0))


# --- unknown names -------------------------------------------------------------------


def test_unknown_app_setting_names_the_closest() -> None:
    with pytest.raises(ConfigError, match="unknown setting 'web_prot'; did you mean 'web_port'"):
        App("orders", web_prot=7070)


def test_unknown_override_and_with_names_the_closest() -> None:
    with pytest.raises(ConfigError, match="did you mean 'data_dir'"):
        App("orders").settings(data_dri="/tmp")
    with pytest.raises(ConfigError, match="did you mean 'poll_timeout_ms'"):
        Settings(app_id="orders").with_(poll_timeout=1)


def test_unknown_setting_without_a_close_one_points_at_the_list() -> None:
    with pytest.raises(ConfigError, match="unknown setting 'colour'; the settings are"):
        App("orders", colour="blue")


def test_app_id_is_not_a_setting_of_app() -> None:
    with pytest.raises(ConfigError, match="first argument"):
        App("orders", app_id="other")


def test_unknown_environment_variable_names_the_closest_setting() -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env("orders", env={"STREAMAPP_WEB_PROT": "7070"})
    assert str(info.value).startswith(
        "environment variable STREAMAPP_WEB_PROT names no setting; did you mean "
        "STREAMAPP_WEB_PORT (setting web_port)? (streamapp reads every STREAMAPP_ variable"
    )


def test_unknown_environment_variable_is_caught_when_the_app_loads_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STREAMAPP_PUBLISH_TIMEOUT", "5")
    with pytest.raises(ConfigError, match="did you mean STREAMAPP_PUBLISH_TIMEOUT_S"):
        App("orders").settings()


def test_producer_acks_is_no_setting() -> None:
    with pytest.raises(ConfigError, match="always publish with acks=all"):
        App("orders", kafka_acks=1)
    with pytest.raises(ConfigError, match=r"STREAMAPP_PRODUCER_ACKS .*acks=all"):
        Settings.from_env("orders", env={"STREAMAPP_PRODUCER_ACKS": "1"})


def test_startup_retry_is_not_read_from_the_environment() -> None:
    with pytest.raises(ConfigError, match=r"startup_retry=Backoff\(\.\.\.\)"):
        Settings.from_env("orders", env={"STREAMAPP_STARTUP_RETRY": "3"})


def test_variables_of_the_projects_scripts_and_tests_are_allowed() -> None:
    env = {name: "x" for name in NOT_SETTINGS}
    env |= {"STREAMAPP_TEST_ARTIFACTS": "/tmp/a", "STREAMAPP_APP_ID": "other", "OTHER_X": "1"}
    assert Settings.from_env("orders", env=env) == Settings(app_id="orders")


VARIABLE = re.compile(r"STREAMAPP_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_])")
REFUSED_HERE = {"STREAMAPP_STARTUP_RETRY", "STREAMAPP_WEB_PROT", "STREAMAPP_PUBLISH_TIMEOUT"}
REFUSED_HERE |= {"STREAMAPP_PRODUCER_ACKS"}


def test_every_streamapp_variable_the_repository_uses_is_allowed() -> None:
    """A variable named by scripts, tests, bench, docs or compose files loads."""
    root = Path(__file__).resolve().parents[2]
    files = [*(root / "scripts").iterdir(), *root.glob("*.md"), *root.glob("*.yml")]
    for folder in ("tests", "bench", "agents", "tables", "streamapp"):
        files += (root / folder).rglob("*.py")
    used = {v for path in files if path.is_file() for v in VARIABLE.findall(path.read_text())}
    assert {"STREAMAPP_KAFKA_HEAP", "STREAMAPP_TEST_ARTIFACTS"} <= used
    assert [name for name in sorted(used - REFUSED_HERE) if not _known(name)] == []


def _known(variable: str) -> bool:
    try:
        Settings.from_env("orders", env={variable: "1"})
    except ConfigError as exc:  # a value refused is fine; the name must be known
        return "names no setting" not in str(exc)
    return True


def test_table_cache_keys_may_be_zero_not_negative() -> None:
    assert Settings(app_id="a", table_cache_keys=0).table_cache_keys == 0
    with pytest.raises(ConfigError, match="table_cache_keys"):
        Settings(app_id="a", table_cache_keys=-1)


def test_publish_and_transaction_timeouts_are_separate() -> None:
    """Confirms, parks and copies wait 5 s; a Kafka transaction may take 30 s."""
    s = Settings(app_id="a")
    assert (s.publish_timeout_s, s.transaction_timeout_s) == (5.0, 30.0)
    env = {"STREAMAPP_TRANSACTION_TIMEOUT_S": "12.5", "STREAMAPP_PUBLISH_TIMEOUT_S": "2"}
    s = Settings.from_env("a", env=env)
    assert (s.publish_timeout_s, s.transaction_timeout_s) == (2.0, 12.5)
    with pytest.raises(ConfigError, match="STREAMAPP_TRANSACTION_TIMEOUT_S"):
        Settings(app_id="a", transaction_timeout_s=-1)


def test_a_data_dir_given_as_text_is_a_path() -> None:
    """``App(data_dir="...")`` as users write it: the worker joins paths onto it."""
    settings = Settings.from_env("a", env={}, data_dir="some/dir")
    assert settings.data_dir == Path("some/dir")
    assert isinstance(settings.data_dir, Path)


def test_settings_given_as_text_take_their_declared_types_or_name_the_setting() -> None:
    settings = Settings.from_env(
        "a", env={}, poll_timeout_ms="200", publish_timeout_s="2.5", amqp_reconnect="off"
    )
    assert (settings.poll_timeout_ms, settings.publish_timeout_s) == (200, 2.5)
    assert settings.amqp_reconnect is False
    with pytest.raises(ConfigError, match=r"setting poll_timeout_ms: .* is not a valid int"):
        Settings.from_env("a", env={}, poll_timeout_ms="soon")


def test_owner_lease_defaults_to_two_thirds_of_the_session_timeout() -> None:
    assert Settings("a").owner_lease() == pytest.approx(10.0 * 2 / 3)
    assert Settings("a", broker="rabbitmq").owner_lease() == pytest.approx(2.0)
    env = {"STREAMAPP_OWNER_LEASE_S": "4.5"}
    assert Settings.from_env("a", env).owner_lease() == 4.5


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"owner_lease_s": -1.0}, "must be 0"),
        ({"owner_lease_s": 10.0}, "below session_timeout_ms"),
        ({"owner_lease_s": 12.0, "session_timeout_ms": 20_000, "broker": "rabbitmq"}, "below amqp"),
        ({"owner_lease_s": 0.5, "broker": "rabbitmq"}, "exceed twice amqp_heartbeat_ms"),
    ],
)
def test_owner_lease_is_refused_unless_below_the_session_timeout(
    changes: dict[str, object], why: str
) -> None:
    with pytest.raises(ConfigError, match="STREAMAPP_OWNER_LEASE_S") as info:
        Settings("a", **changes)  # type: ignore[arg-type]
    assert why in str(info.value)


def test_amqp_heartbeat_defaults_low_and_reads_the_environment() -> None:
    assert Settings("a").amqp_heartbeat_s == 3  # the client's own default is 60 s
    env = {"STREAMAPP_AMQP_HEARTBEAT_S": "4"}
    assert Settings.from_env("a", env).amqp_heartbeat_s == 4


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"amqp_heartbeat_s": 0}, "must be positive"),
        ({"amqp_heartbeat_s": 70_000}, "at most 65535"),
        ({"amqp_url": "amqp://guest:guest@127.0.0.1:5672/?heartbeat=30"}, "heartbeat=30"),
    ],
)
def test_amqp_heartbeat_is_refused_when_out_of_range_or_said_twice(
    changes: dict[str, object], why: str
) -> None:
    with pytest.raises(ConfigError, match="STREAMAPP_AMQP_HEARTBEAT_S") as info:
        Settings("a", **changes)  # type: ignore[arg-type]
    assert why in str(info.value)


def test_an_amqp_url_heartbeat_equal_to_the_setting_is_taken() -> None:
    url = "amqp://guest:guest@127.0.0.1:5672/?heartbeat=7"
    assert Settings("a", amqp_url=url, amqp_heartbeat_s=7).amqp_heartbeat_s == 7
