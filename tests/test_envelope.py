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
        ({"delay-v": b"one"}, "not a decimal number"),
        ({"delay-target": None}, "delay-target is missing"),
        ({"delay-target": b""}, "empty"),
        ({"delay-ms": b"-5"}, "not a decimal number"),
        ({"delay-id": b"\xff"}, "not UTF-8"),
        ({"delay-partition": b"x"}, "not a decimal number"),
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


@pytest.mark.parametrize(
    "field", ["delay-v", "delay-target", "delay-ms", "delay-id", "delay-partition", "delay-due-ms"]
)
def test_a_field_present_without_a_value_is_an_envelope_error(field):
    fields = {**_valid(), "delay-partition": b"1", "delay-due-ms": b"5"}
    fields[field] = None
    with pytest.raises(EnvelopeError, match=f"{field}"):
        unwrap(list(fields.items()))


@pytest.mark.parametrize(
    "value",
    [
        b" 5",
        b"5 ",
        b"1_000",
        "\u0661\u0662".encode(),  # Arabic-Indic digits: int() takes them
        "\uff11\uff12".encode(),  # full-width digits: so does int()
        b"+5",
        b"9" * 16,
        b"9" * 5000,
        b"0x10",
    ],
)
def test_numbers_are_plain_ascii_decimal_and_bounded(value):
    with pytest.raises(EnvelopeError, match="delay-ms is not a decimal number"):
        unwrap(list({**_valid(), "delay-ms": value}.items()))


def test_a_partition_beyond_int32_is_refused():
    with pytest.raises(EnvelopeError, match="delay-partition must be in"):
        unwrap(list({**_valid(), "delay-partition": b"2147483648"}.items()))


def test_error_messages_quote_hostile_values_briefly():
    with pytest.raises(EnvelopeError) as caught:
        unwrap(list({**_valid(), "delay-ms": b"x" * 1_000_000}.items()))
    assert len(str(caught.value)) < 200


@given(
    st.lists(
        st.tuples(
            st.one_of(
                st.sampled_from(["delay-v", "delay-target", "delay-ms", "delay-id"]),
                st.sampled_from(["delay-partition", "delay-due-ms"]),
                st.text(max_size=12),
            ),
            st.one_of(st.none(), st.binary(max_size=24), st.text(max_size=24)),
        ),
        max_size=10,
    )
)
def test_any_headers_at_all_give_an_envelope_or_an_envelope_error(headers):
    try:
        envelope, _user, _size = unwrap(headers)
    except EnvelopeError:
        return
    assert envelope.target
    assert envelope.id
    assert envelope.delay_ms >= 0


def test_target_names_too_long_for_a_topic_are_not_memoised():
    """Names come from records: a hostile stream of huge distinct targets must not
    pile up in the memo that lets records of one target share a string."""
    from delayservice import envelope

    for i in range(50):
        huge = f"{i}-".encode() + b"t" * 100_000
        parsed, _, _ = unwrap(wrap(Envelope(huge.decode(), 1000, f"id-{i}"), []))
        assert len(parsed.target) == len(huge)
    assert all(len(raw) <= 249 for raw in envelope._TARGET_NAMES)
