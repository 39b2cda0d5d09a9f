"""The private faust / aiokafka members the worker relies on, pinned (issue 31 item 7).

faust-streaming and aiokafka are allowed to move within their minor versions (pyproject.toml);
these are the only private members the worker touches, all from agents/batch_intake.py. Each
test names what is relied on and fails when an upgrade changes it, so an upgrade cannot silently
reopen a hole. (The worker tests on the real broker exercise the same paths end to end.)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import faust
import pytest
from aiokafka import AIOKafkaConsumer
from faust.transport import consumer as faust_consumer
from faust.transport.drivers import aiokafka as aiokafka_driver

import agents.batch_intake as batch_intake


def parameters(function: Callable[..., Any]) -> list[str]:
    return list(inspect.signature(function).parameters)


def source(function: Callable[..., Any]) -> str:
    return inspect.getsource(function)


def test_every_private_member_used_is_pinned_here() -> None:
    """The adapter's private uses are exactly the ones this file pins: a new one needs a pin."""
    text = inspect.getsource(batch_intake)
    used = {
        name
        for name in (
            "_create_worker_consumer",
            "_fetch_max_wait_ms",
            "_subscription",
            "_fetch_records",
            "_drain_messages",
            "_wait_next_records",
            "_stop_consumer",
            "_commit_offsets",
            "_ensure_producer",
        )
        if name in text
    }
    assert used == {
        "_create_worker_consumer",
        "_fetch_max_wait_ms",
        "_subscription",
        "_fetch_records",
        "_drain_messages",
        "_wait_next_records",
        "_stop_consumer",
        "_commit_offsets",
        "_ensure_producer",
    }


def test_the_consumer_thread_builds_its_aiokafka_consumer_in_one_overridable_method() -> None:
    thread = aiokafka_driver.AIOKafkaConsumerThread
    assert parameters(thread._create_worker_consumer) == ["self", "transport"]
    # ... and every fetch goes through `_fetch_records(consumer, active_partitions, ...)`.
    assert parameters(thread._fetch_records)[:3] == ["self", "consumer", "active_partitions"]
    assert "fetched_records(" in source(thread._fetch_records)


def test_aiokafka_reads_its_fetch_wait_from_the_attribute_when_it_starts() -> None:
    """The intake shortens the broker's fetch wait after construction: the fetcher is built in
    start() from `self._fetch_max_wait_ms`."""
    assert "self._fetch_max_wait_ms = fetch_max_wait_ms" in source(AIOKafkaConsumer.__init__)
    assert "fetch_max_wait_ms=self._fetch_max_wait_ms" in source(AIOKafkaConsumer.start)


def test_the_assignment_is_one_object_replaced_on_every_rebalance() -> None:
    """The intake tells a fetch that straddled a rebalance by the identity of
    `consumer._subscription.subscription.assignment` and reads positions from its
    partition states (`state_value(tp).position`, `has_valid_position`)."""
    from aiokafka.consumer.subscription_state import Assignment, Subscription, SubscriptionState

    assert isinstance(inspect.getattr_static(SubscriptionState, "subscription"), property)
    assert isinstance(inspect.getattr_static(Subscription, "assignment"), property)
    assert parameters(Assignment.state_value) == ["self", "tp"]
    assert "_assignment = Assignment(" in source(Subscription._assign)
    from aiokafka.consumer.subscription_state import TopicPartitionState

    assert isinstance(inspect.getattr_static(TopicPartitionState, "has_valid_position"), property)
    assert isinstance(inspect.getattr_static(TopicPartitionState, "position"), property)


def test_faust_drains_its_fetcher_in_one_overridable_loop() -> None:
    consumer = faust_consumer.Consumer
    assert parameters(consumer._drain_messages) == ["self", "fetcher"]
    assert parameters(consumer._wait_next_records) == ["self", "timeout"]
    # The fetcher service's loop calls it: overriding it replaces the per-record path.
    assert "_drain_messages" in inspect.getsource(faust_consumer.Fetcher)


def test_the_app_stops_its_consumer_in_one_overridable_step() -> None:
    """Hooks run before the consumer stops (the last checkpoint of a clean shutdown)."""
    assert parameters(faust.App._stop_consumer) == ["self"]
    assert "_stop_consumer" in source(faust.App._on_rebalance_when_stopped) or "_stop_consumer" in (
        inspect.getsource(faust.App)
    )


def test_faust_commits_given_offsets_and_returns_whether_it_did() -> None:
    """Committed offsets serve lag monitoring only (the position is the checkpoint's): the
    worker passes {TP: offset} and reads a bool."""
    commit = faust_consumer.Consumer._commit_offsets
    assert parameters(commit)[:2] == ["self", "offsets"]
    assert inspect.signature(commit).return_annotation in (bool, "bool")


def test_the_aiokafka_driver_producer_hands_out_its_aiokafka_producer() -> None:
    ensure = aiokafka_driver.Producer._ensure_producer
    assert parameters(ensure) == ["self"]
    assert "AIOKafkaProducer" in str(inspect.signature(ensure).return_annotation)


@pytest.mark.parametrize("package", ["faust", "aiokafka"])
def test_the_installed_versions_are_within_the_pinned_ranges(package: str) -> None:
    from importlib.metadata import version

    from packaging.version import Version

    installed = Version(version("faust-streaming" if package == "faust" else package))
    low, high = {"faust": ("0.15.3", "0.16"), "aiokafka": ("0.14", "0.15")}[package]
    assert Version(low) <= installed < Version(high)
