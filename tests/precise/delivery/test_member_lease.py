"""The member lease's rule, with no broker: another member of the lease group stops
the daemon only once it has stayed longer than a session (a dead one is gone by
then), with one line naming it."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from delayservice.errors import ConfigError
from delayservice.kafka.group_members import Member
from delayservice.precise.delivery import member_lease
from delayservice.settings_loading import load_settings


def _settings() -> Any:
    return load_settings(
        bootstrap_servers="127.0.0.1:1",
        levels="1s",
        group_id="ds",
        precise=True,
        precise_members=2,
        precise_member=1,
        session_timeout_s=10.0,
    )


def _member(member_id: str, host: str = "/10.0.0.8") -> Member:
    return Member("ds-precise-member-1", member_id, "delayservice-h2-77-member-1", host)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _lease(clock: Clock, fatal: list[str]) -> member_lease.MemberLease:
    return member_lease.MemberLease(_settings(), fatal.append, lambda: None, clock=clock)


def test_another_member_that_stays_past_a_session_stops_the_daemon_with_one_line():
    clock, fatal = Clock(), []
    lease = _lease(clock, fatal)
    lease.look("me", [_member("me"), _member("twin")])
    clock.now = 10.0  # exactly a session: it may be a dead one, not yet removed
    lease.look("me", [_member("me"), _member("twin")])
    assert fatal == []
    clock.now = 10.5
    lease.look("me", [_member("me"), _member("twin")])
    lease.look("me", [_member("me"), _member("twin")])
    assert fatal == [
        "precise_member 1 already runs in another process (ds-precise-member-1: member "
        "twin client delayservice-h2-77-member-1 host /10.0.0.8): two processes of one "
        "member forward the same records and fence each other's transactions for ever; "
        "give each instance its own precise_member (docs/precise-mode.md, One process "
        "per member)"
    ]
    assert lease.health() == (False, fatal[0])


def test_a_member_that_goes_within_its_session_is_a_dead_one_and_forgotten():
    clock, fatal = Clock(), []
    lease = _lease(clock, fatal)
    lease.look("me", [_member("me"), _member("killed")])
    clock.now = 8.0
    lease.look("me", [_member("me")])
    clock.now = 30.0
    lease.look("me", [_member("me"), _member("killed-restarted")])  # seen anew
    assert fatal == []
    assert lease.health() == (True, "")


def test_no_answer_a_group_mid_rebalance_or_not_yet_joined_decides_nothing():
    clock, fatal = Clock(), []
    lease = _lease(clock, fatal)
    busy = Member("ds-precise-member-1", "(none yet, PreparingRebalance)", "-", "-")
    for now in (0.0, 20.0, 40.0):
        clock.now = now
        lease.look("me", None)
        lease.look(None, [_member("other")])
        lease.look("me", [_member("me"), busy])
    assert fatal == []


def test_start_up_refuses_while_the_lease_group_keeps_a_member(monkeypatch):
    live = [_member("first")]
    monkeypatch.setattr(member_lease, "wait_until_empty", lambda *args, **kwargs: live)
    with pytest.raises(ConfigError) as refused:
        _lease(Clock(), []).claim(threading.Event())
    assert str(refused.value).startswith(
        "invalid setting precise_member: precise_member 1 already runs in another process "
        "(ds-precise-member-1: member first client delayservice-h2-77-member-1"
    )
    monkeypatch.setattr(member_lease, "wait_until_empty", lambda *args, **kwargs: [])
    _lease(Clock(), []).claim(threading.Event())  # empty: goes ahead


def test_this_hosts_killed_predecessor_is_not_waited_for_but_a_live_process_is():
    me = member_lease.lease_client_id(1)
    dead = member_lease.lease_client_id(1, pid=999_999_999)
    alive = member_lease.lease_client_id(1, pid=4242)
    elsewhere = member_lease.lease_client_id(1, host="other-host", pid=999_999_999)

    def running(pid: int) -> bool:
        return pid == 4242

    def seen(client_id: str) -> Member:
        return Member("ds-precise-member-1", "m-1", client_id, "/10.0.0.8")

    assert member_lease.predecessor(1, seen(dead), running)
    assert member_lease.predecessor(1, seen(me), running)  # a container's pid 1, restarted
    assert not member_lease.predecessor(1, seen(alive), running)
    assert not member_lease.predecessor(1, seen(elsewhere), running)  # cannot tell: wait
    assert not member_lease.predecessor(0, seen(dead), running)  # another member's lease
    assert not member_lease.predecessor(1, seen("rdkafka"), running)
