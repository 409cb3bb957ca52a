"""The layout guard's rules over a described group, with no broker: what counts as a
live member, how long start-up waits for a stopped one to go, and the watch."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import GroupMember, GroupMetadata

from delayservice.errors import ConfigError
from delayservice.kafka import group_members
from delayservice.level import layout_guard
from delayservice.settings_loading import load_settings


def _settings(layout: str = "shared") -> Any:
    return load_settings(
        bootstrap_servers="127.0.0.1:1",
        levels="1s,2s",
        group_id="ds",
        instance_name="host-a",
        level_workers=layout,
        session_timeout_s=1.0,
    )


def _member(instance: str) -> GroupMember:
    member = GroupMember()
    member.id = f"{instance}-1234"
    member.client_id = f"delayservice-{instance}"
    member.client_host = "/10.0.0.7"
    return member


class FakeAdmin:
    """`list_groups` answering as confluent-kafka's does, from `groups`: group ->
    (state, members) or the group's own error (a `KafkaError` on its `GroupMetadata`);
    a group absent was never joined, so it is not listed. `down`: the call raises, as
    librdkafka's does when no broker answers."""

    def __init__(self) -> None:
        self.groups: dict[str, Any] = {}
        self.down = False
        self.asked = 0

    def list_groups(self, group: str | None = None, timeout: float = -1) -> list[GroupMetadata]:
        self.asked += 1
        if self.down:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        found = []
        for name, entry in self.groups.items():
            if group is not None and name != group:
                continue
            described = GroupMetadata()
            described.id = name
            if isinstance(entry, KafkaError):
                described.error = entry
                described.state = "Dead"
            else:
                described.state, described.members = entry
            found.append(described)
        return found


def test_the_other_layouts_groups_are_each_levels_group_or_the_shared_one():
    assert layout_guard.other_groups(_settings("shared")) == [
        "ds-delay_topic_1",
        "ds-delay_topic_2",
    ]
    assert layout_guard.other_groups(_settings("per-level")) == ["ds-levels"]


def test_members_are_named_with_group_member_client_and_host():
    admin = FakeAdmin()
    admin.groups["ds-delay_topic_2"] = (
        "Stable",
        [_member("host-b-delay_topic_2")],
    )
    (live,) = group_members.members(admin, layout_guard.other_groups(_settings()))
    assert str(live) == (
        "ds-delay_topic_2: member host-b-delay_topic_2-1234 "
        "client delayservice-host-b-delay_topic_2 host /10.0.0.7"
    )


def test_a_groups_own_error_is_not_knowing_not_an_empty_group():
    admin = FakeAdmin()
    admin.groups["ds-levels"] = KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS)
    assert group_members.members(admin, ["ds-levels"]) is None


def test_a_group_mid_rebalance_with_no_member_listed_is_live_and_empty_or_dead_is_not():
    admin = FakeAdmin()
    admin.groups["ds-levels"] = ("PreparingRebalance", [])
    (live,) = group_members.members(admin, ["ds-levels"])
    assert "PreparingRebalance" in str(live)
    admin.groups["ds-levels"] = ("Empty", [])
    assert group_members.members(admin, ["ds-levels"]) == []


def test_start_up_refuses_with_one_line_when_a_member_stays_past_the_wait():
    admin = FakeAdmin()
    admin.groups["ds-levels"] = ("Stable", [_member("host-b-levels")])
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
    admin.groups["ds-levels"] = ("Stable", [_member("host-a-levels")])
    real_list = admin.list_groups

    def list_groups(group: str | None = None, timeout: float = -1) -> list[GroupMetadata]:
        if admin.asked == 3:  # its session ran out
            admin.groups["ds-levels"] = ("Empty", [])
        return real_list(group, timeout)

    admin.list_groups = list_groups  # type: ignore[method-assign]
    layout_guard.wait_until_alone(admin, _settings("per-level"), threading.Event(), wait_s=1.0)
    assert admin.asked == 4


def test_a_broker_that_does_not_answer_is_asked_again_not_a_refusal(monkeypatch):
    monkeypatch.setattr(group_members, "ASK_EVERY_S", 0.01)
    admin = FakeAdmin()
    admin.down = True
    stop = threading.Event()
    real_list = admin.list_groups

    def list_groups(group: str | None = None, timeout: float = -1) -> list[GroupMetadata]:
        if admin.asked == 50:
            admin.down = False  # back, and nobody of the other layout there
        return real_list(group, timeout)

    admin.list_groups = list_groups  # type: ignore[method-assign]
    layout_guard.wait_until_alone(admin, _settings("per-level"), stop, wait_s=0)
    assert admin.asked == 51


def test_the_watch_turns_readiness_red_and_logs_an_error_while_the_other_layout_runs(caplog):
    admin = FakeAdmin()
    watch = layout_guard.LayoutWatch(_settings(), lambda: admin)
    watch.look(admin)
    assert watch.health() == (True, "")

    admin.groups["ds-delay_topic_1"] = ("Stable", [_member("host-b-t1")])
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
    admin.groups["ds-delay_topic_1"] = ("Empty", [])
    watch.look(admin)
    assert watch.health() == (True, "")
