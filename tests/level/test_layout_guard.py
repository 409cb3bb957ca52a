"""The layout guard's rules over a described group, with no broker: what counts as a
live member, how long start-up waits for a stopped one to go, and the watch."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupState, KafkaError, KafkaException

from delayservice.errors import ConfigError
from delayservice.kafka import group_members
from delayservice.level import layout_guard
from delayservice.settings import load_settings


def _settings(layout: str = "shared") -> Any:
    return load_settings(
        bootstrap_servers="127.0.0.1:1",
        levels="1s,2s",
        group_id="ds",
        instance_name="host-a",
        level_workers=layout,
        session_timeout_s=1.0,
    )


def _member(instance: str) -> Any:
    return SimpleNamespace(
        member_id=f"{instance}-1234",
        group_instance_id=instance,
        client_id=f"delayservice-{instance}",
        host="/10.0.0.7",
    )


class FakeAdmin:
    """`describe_consumer_groups` answering from `groups`: group -> (state, members), an
    exception to raise from the group's future, or absent (never joined)."""

    def __init__(self) -> None:
        self.groups: dict[str, Any] = {}
        self.down = False
        self.asked = 0

    def describe_consumer_groups(self, groups: list[str], request_timeout: float) -> Any:
        self.asked += 1
        if self.down:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        answers = {}
        for group in groups:
            future: Future[Any] = Future()
            entry = self.groups.get(group, (ConsumerGroupState.DEAD, []))
            if isinstance(entry, BaseException):
                future.set_exception(entry)
            else:
                state, members = entry
                future.set_result(SimpleNamespace(state=state, members=members))
            answers[group] = future
        return answers


def test_the_other_layouts_groups_are_each_levels_group_or_the_shared_one():
    assert layout_guard.other_groups(_settings("shared")) == [
        "ds-delay_topic_1",
        "ds-delay_topic_2",
    ]
    assert layout_guard.other_groups(_settings("per-level")) == ["ds-levels"]


def test_members_are_named_with_group_member_instance_client_and_host():
    admin = FakeAdmin()
    admin.groups["ds-delay_topic_2"] = (
        ConsumerGroupState.STABLE,
        [_member("host-b-delay_topic_2")],
    )
    admin.groups["ds-delay_topic_1"] = KafkaException(KafkaError(KafkaError.GROUP_ID_NOT_FOUND))
    (live,) = group_members.members(admin, layout_guard.other_groups(_settings()))
    assert str(live) == (
        "ds-delay_topic_2: member host-b-delay_topic_2-1234 instance host-b-delay_topic_2 "
        "client delayservice-host-b-delay_topic_2 host /10.0.0.7"
    )


def test_a_group_mid_rebalance_with_no_member_listed_is_live_and_empty_or_dead_is_not():
    admin = FakeAdmin()
    admin.groups["ds-levels"] = (ConsumerGroupState.PREPARING_REBALANCING, [])
    (live,) = group_members.members(admin, ["ds-levels"])
    assert "PREPARING_REBALANCING" in str(live)
    admin.groups["ds-levels"] = (ConsumerGroupState.EMPTY, [])
    assert group_members.members(admin, ["ds-levels"]) == []


def test_start_up_refuses_with_one_line_when_a_member_stays_past_the_wait():
    admin = FakeAdmin()
    admin.groups["ds-levels"] = (ConsumerGroupState.STABLE, [_member("host-b-levels")])
    with pytest.raises(ConfigError) as refused:
        layout_guard.wait_until_alone(admin, _settings("per-level"), threading.Event(), wait_s=0)
    line = str(refused.value)
    assert "\n" not in line
    assert line.startswith(
        "invalid setting level_workers: level_workers is 'per-level' but the 'shared' "
        "layout's consumer groups have live members (ds-levels: member host-b-levels-1234"
    ), line
    assert "stop every instance before changing level_workers" in line


def test_start_up_goes_ahead_once_a_stopped_static_member_times_out(monkeypatch):
    monkeypatch.setattr(group_members, "ASK_EVERY_S", 0.01)
    admin = FakeAdmin()
    admin.groups["ds-levels"] = (ConsumerGroupState.STABLE, [_member("host-a-levels")])
    real_describe = admin.describe_consumer_groups

    def describe(groups: list[str], request_timeout: float) -> Any:
        if admin.asked == 3:  # its session ran out
            admin.groups["ds-levels"] = (ConsumerGroupState.EMPTY, [])
        return real_describe(groups, request_timeout)

    admin.describe_consumer_groups = describe  # type: ignore[method-assign]
    layout_guard.wait_until_alone(admin, _settings("per-level"), threading.Event(), wait_s=1.0)
    assert admin.asked == 4


def test_a_broker_that_does_not_answer_is_asked_again_not_a_refusal(monkeypatch):
    monkeypatch.setattr(group_members, "ASK_EVERY_S", 0.01)
    admin = FakeAdmin()
    admin.down = True
    stop = threading.Event()
    real_describe = admin.describe_consumer_groups

    def describe(groups: list[str], request_timeout: float) -> Any:
        if admin.asked == 50:
            admin.down = False  # back, and nobody of the other layout there
        return real_describe(groups, request_timeout)

    admin.describe_consumer_groups = describe  # type: ignore[method-assign]
    layout_guard.wait_until_alone(admin, _settings("per-level"), stop, wait_s=0)
    assert admin.asked == 51


def test_the_watch_turns_readiness_red_and_logs_an_error_while_the_other_layout_runs(caplog):
    admin = FakeAdmin()
    watch = layout_guard.LayoutWatch(_settings(), lambda: admin)
    watch.look(admin)
    assert watch.health() == (True, "")

    admin.groups["ds-delay_topic_1"] = (ConsumerGroupState.STABLE, [_member("host-b-t1")])
    with caplog.at_level(logging.INFO, logger=layout_guard.__name__):
        watch.look(admin)
        watch.look(admin)  # the same members: one ERROR, not one a look
        admin.down = True
        watch.look(admin)  # no answer: what was seen stands
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "ds-delay_topic_1: member host-b-t1-1234" in errors[0].getMessage()
    ok, why = watch.health()
    assert not ok
    assert "'per-level' layout's consumer groups have live members" in why

    admin.down = False
    admin.groups["ds-delay_topic_1"] = (ConsumerGroupState.EMPTY, [])
    watch.look(admin)
    assert watch.health() == (True, "")
