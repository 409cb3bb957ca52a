"""`read_headers` on records whose `headers()` misbehaves the way confluent-kafka's does."""

from __future__ import annotations

from typing import Any

from delayservice.kafka.record_headers import UNREADABLE, read_headers


class PoisonedRecord:
    """Raises on the first `headers()` call and crashes (here: raises AssertionError) on
    any later one unless `set_headers` replaced the cache, as the real client does."""

    def __init__(self) -> None:
        self.calls = 0
        self.replaced: Any = None
        self.was_replaced = False

    def headers(self) -> Any:
        self.calls += 1
        if self.was_replaced:
            return self.replaced
        if self.calls > 1:
            raise AssertionError("second headers() on a poisoned record would segfault")
        raise SystemError("returned a result with an exception set")

    def set_headers(self, headers: Any) -> None:
        self.replaced, self.was_replaced = headers, True


class PlainRecord:
    def __init__(self, headers: Any) -> None:
        self._headers = headers

    def headers(self) -> Any:
        return self._headers


def test_a_record_that_raises_is_unreadable_and_safe_to_read_again() -> None:
    record = PoisonedRecord()
    assert read_headers(record) is UNREADABLE
    assert read_headers(record) is UNREADABLE
    assert record.headers() == ()  # a stray direct call gets an empty value, not a crash


def test_readable_headers_pass_through_unchanged() -> None:
    headers = [("a", b"1"), ("", None)]
    assert read_headers(PlainRecord(headers)) is headers
    assert read_headers(PlainRecord(None)) is None


def test_a_record_without_set_headers_is_still_reported_unreadable() -> None:
    class Raising:
        def headers(self) -> Any:
            raise SystemError("boom")

    assert read_headers(Raising()) is UNREADABLE


def test_unreadable_is_empty_immutable_and_not_a_list() -> None:
    assert len(UNREADABLE) == 0
    assert not isinstance(UNREADABLE, list)


def test_header_values_keeps_the_last_of_a_name_and_leaves_out_nulls() -> None:
    from delayservice.kafka.record_headers import header_values

    record = PlainRecord([("a", b"1"), ("b", None), ("a", b"2")])
    assert header_values(record) == {"a": b"2"}
    assert header_values(PlainRecord(None)) == {}
    assert header_values(PoisonedRecord()) == {}
