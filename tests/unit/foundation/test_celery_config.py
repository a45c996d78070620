"""The Celery configuration keeps at-least-once delivery from turning into twice-run tasks."""

from __future__ import annotations

import pytest

from app.errors import ConfigError
from app.settings import load_settings
from workers.config import QUEUES, build_config, check_time_limits


def _conf() -> dict[str, object]:
    return build_config(load_settings({"TUNEHARNESS_HOME": "/nonexistent-home"}))


def test_json_only_late_acks_prefetch_one_and_events_on() -> None:
    """Tasks are JSON, acknowledged after running, one at a time, and visible to Flower."""
    c = _conf()
    assert c["task_serializer"] == "json" and c["accept_content"] == ["json"]
    assert c["task_acks_late"] is True and c["task_reject_on_worker_lost"] is True
    assert c["worker_prefetch_multiplier"] == 1
    assert c["worker_send_task_events"] is True and c["task_send_sent_event"] is True
    assert c["task_soft_time_limit"] < c["task_time_limit"]  # type: ignore[operator]


def test_every_queue_has_a_route() -> None:
    """Each of the five queues receives the tasks named after it."""
    routes = _conf()["task_routes"]
    assert isinstance(routes, dict)
    assert {r["queue"] for r in routes.values()} == set(QUEUES)


def test_the_shipped_configuration_passes_the_start_up_check() -> None:
    """The visibility timeout exceeds every limit and countdown we ship."""
    check_time_limits(_conf())


def test_visibility_timeout_shorter_than_a_task_limit_refuses_to_start() -> None:
    """A task whose hard limit reaches the visibility timeout is refused, naming it."""
    with pytest.raises(ConfigError, match=r"tuneharness\.evaluate\.slow"):
        check_time_limits(_conf(), {"tuneharness.evaluate.slow.time_limit": 10_000})


@pytest.mark.parametrize("key", ["broker_transport_options", "result_backend_transport_options", "visibility_timeout"])
def test_visibility_timeout_missing_in_any_of_three_places_refuses(key: str) -> None:
    """The timeout must be set where the broker, the result backend and Celery each read it."""
    c = _conf()
    c[key] = {} if key.endswith("options") else None
    with pytest.raises(ConfigError, match="visibility timeout"):
        check_time_limits(c)


def test_visibility_timeouts_that_disagree_refuse() -> None:
    """Different values in the three places are refused."""
    c = _conf()
    c["visibility_timeout"] = 100_000
    with pytest.raises(ConfigError, match="disagree"):
        check_time_limits(c)
