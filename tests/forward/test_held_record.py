"""What a level holds of a plain record, and how the slow paths see it again."""

from __future__ import annotations

from confluent_kafka import TIMESTAMP_CREATE_TIME

from delayservice.envelope import Envelope, plain_tail, wrap
from delayservice.forward import speedups
from delayservice.forward.held_record import DUE, HeldView, entry_bytes, offset_of, record_of
from tests.level.fakes import message

DELAY_MS = 5_000
NOW = 1_700_000_000_000


def _held(headers, **kwargs):
    record = message(2, 7, NOW, headers=headers, **kwargs)
    hold_run = speedups.fast_path().hold_run  # each implementation (conftest)
    (entry,), latest, unstamped = hold_run([record], DELAY_MS, 1_000, NOW + 3)
    return record, entry, latest, unstamped


def test_a_held_record_is_seen_again_with_the_headers_it_was_read_with():
    headers = wrap(Envelope("orders", 4_000, "id-1"), [("trace", b"abc"), ("empty", None)])
    record, entry, latest, unstamped = _held(headers, key=None, value=b"payload")
    assert type(entry) is tuple
    assert entry[DUE] == latest == NOW + DELAY_MS
    assert unstamped == []
    view = record_of((record.topic(), 2), entry)
    assert isinstance(view, HeldView)
    assert view.headers() == headers == record.headers()
    assert (view.topic(), view.offset(), view.partition()) == (record.topic(), 7, 2)
    assert (view.key(), view.value()) == (None, b"payload")
    assert view.due_ms == NOW + DELAY_MS
    assert view.error() is None
    assert plain_tail(view.headers()) == plain_tail(headers)
    assert offset_of(entry) == offset_of(view) == offset_of(record) == 7
    assert entry_bytes(entry, 64) == len(view) + 64 == len(b"payload") + 64


def test_a_record_the_broker_did_not_stamp_is_kept_and_due_a_level_after_reading():
    headers = wrap(Envelope("orders", 4_000, "id-1"), None)
    record, entry, latest, unstamped = _held(headers, timestamp_type=TIMESTAMP_CREATE_TIME)
    assert entry is record
    assert unstamped == [(7, NOW + 3 + DELAY_MS)]
    assert latest == NOW + 3 + DELAY_MS


def test_a_user_header_in_the_reserved_namespace_keeps_the_record_for_the_full_parse():
    headers = [("delay-x", b"1"), *Envelope("orders", 4_000, "id-1").headers()]
    record, entry, _, _ = _held(headers)
    assert entry is record


def test_a_tombstone_is_held_with_no_value():
    headers = wrap(Envelope("orders", 5_000, "id-1"), None)
    _, entry, _, _ = _held(headers, value=None)
    assert type(entry) is tuple
    assert entry[3] is None
    assert entry_bytes(entry, 64) == 64


def test_consecutive_records_share_their_header_names_and_delay():
    """What repeats from record to record is kept once: 48-64 bytes a held record."""
    hold_run = speedups.fast_path().hold_run
    records = [
        message(
            0, offset, NOW, headers=[*user, *Envelope("orders", 4_000, f"id-{offset}").headers()]
        )
        for offset, user in enumerate(
            [[("trace", b"a")], [("trace", b"b")], [("span", b"c")], [("delay-x", b"d")]]
        )
    ]
    entries, _, _ = hold_run(records, DELAY_MS, 1_000, NOW)
    first, second, third, reserved = entries
    assert first[5][0][0] is second[5][0][0]
    assert first[7] is second[7] is third[7]
    assert (first[5], second[5], third[5]) == (
        (("trace", b"a"),),
        (("trace", b"b"),),
        (("span", b"c"),),
    )
    assert reserved is records[3]  # the reserved prefix still sends it to the full parse
