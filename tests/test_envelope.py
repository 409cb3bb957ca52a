import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayservice.envelope import Envelope, _checked, forwarded_headers, unwrap, wrap
from delayservice.errors import EnvelopeError


def test_wrap_then_unwrap_keeps_the_envelope_and_user_headers():
    env = Envelope("orders", 17_000, "abc", partition=2)
    headers = wrap(env, [("trace", b"t1"), ("empty", b"")])
    got, user, _size = unwrap(headers)
    assert got == env
    assert user == [("trace", b"t1"), ("empty", b"")]


def test_user_headers_may_not_use_the_reserved_prefix():
    with pytest.raises(EnvelopeError, match="reserved"):
        wrap(Envelope("t", 1, "i"), [("delay-target", b"x")])


def test_forwarded_headers_keep_id_and_due_time_for_audit():
    env = Envelope("orders", 1000, "abc")
    assert forwarded_headers([("a", b"1")], env, 123) == [
        ("a", b"1"),
        ("delay-id", b"abc"),
        ("delay-due-ms", b"123"),
    ]


def _valid() -> dict[str, bytes]:
    return {"delay-v": b"1", "delay-target": b"t", "delay-ms": b"5", "delay-id": b"x"}


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"delay-v": None}, "no envelope"),
        ({"delay-v": b"2"}, "not supported"),
        ({"delay-v": b"one"}, "not an integer"),
        ({"delay-target": None}, "delay-target is missing"),
        ({"delay-target": b""}, "empty"),
        ({"delay-ms": b"-5"}, "at least 0"),
        ({"delay-id": b"\xff"}, "not UTF-8"),
        ({"delay-partition": b"x"}, "not an integer"),
    ],
)
def test_each_broken_envelope_gets_a_reason(change, reason):
    fields = _valid()
    for name, value in change.items():
        if value is None:
            fields.pop(name)
        else:
            fields[name] = value
    with pytest.raises(EnvelopeError, match=reason):
        unwrap(list(fields.items()))


def test_no_headers_at_all_is_no_envelope():
    with pytest.raises(EnvelopeError, match="no envelope"):
        unwrap(None)


def test_a_header_given_twice_is_refused():
    with pytest.raises(EnvelopeError, match="twice"):
        unwrap([*_valid().items(), ("delay-id", b"y")])


_field_values = st.one_of(
    st.none(),
    st.sampled_from(
        [b"1", b"2", b"0", b"-1", b"", b"x", b"007", b" 5", b"\xff", b"orders", b"9" * 20]
    ),
)


@given(
    st.dictionaries(
        st.sampled_from(
            ["delay-v", "delay-target", "delay-ms", "delay-id", "delay-partition", "delay-due-ms"]
        ),
        _field_values,
    )
)
def test_the_fast_path_agrees_with_the_field_by_field_check(fields):
    headers = list(fields.items())
    env = dict(fields)
    try:
        expected = _checked(env)
    except EnvelopeError:
        expected = None
    try:
        got, _user, size = unwrap(headers)
    except EnvelopeError:
        got = None
    assert got == expected
    if got is not None:
        assert size == sum(len(n) + len(v or b"") for n, v in headers)
