import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from delayservice.envelope import (
    Envelope,
    _checked,
    forwarded_headers,
    plain_tail,
    unwrap,
    wrap,
)
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


_header_lists = st.lists(
    st.tuples(
        st.one_of(
            st.sampled_from(["delay-v", "delay-target", "delay-ms", "delay-id"]),
            st.sampled_from(["delay-partition", "delay-due-ms", "delay-cancel", "user"]),
            st.text(max_size=8),
        ),
        st.one_of(
            st.none(),
            st.sampled_from(
                [b"1", b"2", b"01", b"0", b"42", b"orders", b"\xff", b"9" * 16, b"", b"a-p0"]
            ),
            st.binary(max_size=12),
            st.text(max_size=6),
        ),
    ),
    max_size=9,
)


_tail = [
    ("delay-v", b"1"),
    ("delay-target", b"orders"),
    ("delay-ms", b"1500"),
    ("delay-id", b"0123456789abcdef0123456789abcdef-p2"),
    ("delay-partitioner", b"consistent_random"),
    ("delay-due-ms", b"1700000000000"),
]


_benign_user = st.lists(
    st.tuples(
        st.text(max_size=8).filter(lambda n: not n.startswith("delay-")), st.binary(max_size=8)
    )
)
_hostile_value = st.one_of(
    st.none(),
    st.sampled_from(
        [b"1", b"2", b"01", b"0", b"42", b"orders", b"\xff", b"9" * 16, b"", b"a-p0", b" 1"]
    ),
    st.binary(max_size=12),
    st.text(max_size=6),
)
_kept = st.just(("keep", None))


@settings(max_examples=500)
@given(
    st.one_of(_benign_user, _benign_user, _header_lists),
    st.lists(
        st.one_of(
            _kept,
            _kept,
            st.tuples(st.just("value"), _hostile_value),
            st.tuples(
                st.just("name"),
                st.sampled_from(["delay-id", "delay-partition", "delay-partitioner", "x"]),
            ),
        ),
        min_size=len(_tail),
        max_size=len(_tail),
    ),
    st.one_of(st.just(0), st.just(0), st.just(0), st.integers(0, len(_tail))),
    st.one_of(st.just(False), st.just(False), st.booleans()),
)
def test_the_plain_tail_reads_only_what_unwrap_reads_the_same_way(user, changes, cut, extra):
    """The intake's fast read may refuse anything, but what it accepts must be exactly
    what the full parse makes of it: a valid tail behind hostile user headers, with a
    field's value or name swapped for a hostile one, fields dropped, or one twice."""
    tail: list = []
    for (name, value), (how, change) in zip(_tail, changes, strict=True):
        if how == "value":
            tail.append((name, change))
        elif how == "name":
            tail.append((change, value))
        else:
            tail.append((name, value))
    headers = user + tail[cut:] + (tail[:1] if extra else [])
    tail = plain_tail(headers)
    if tail is None:
        return
    envelope, full_user, _size = unwrap(headers)
    target, delay_ms, message_id, due_ms, plain_user, partitioner = tail
    assert envelope == Envelope(target, delay_ms, message_id, None, due_ms, partitioner=partitioner)
    assert plain_user == full_user


@given(
    st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=8)))),
    st.sampled_from([None, 1_700_000_000_000]),
    st.sampled_from([None, "consistent_random", "murmur2", "fnv1a_random"]),
)
def test_the_plain_tail_reads_what_wrap_writes(user, due_ms, partitioner):
    """Every envelope the producer writes without a target partition takes the fast read,
    unless a user header uses the reserved prefix (which `wrap` refuses anyway)."""
    envelope = Envelope(
        "orders",
        1500,
        "0123456789abcdef0123456789abcdef-p2",
        None,
        due_ms,
        partitioner=partitioner,
    )
    try:
        headers = wrap(envelope, user)
    except EnvelopeError:
        return
    assert plain_tail(headers) == ("orders", 1500, envelope.id, due_ms, user, partitioner)


_HOSTILE_VALUES = [
    None,
    b"consistent",
    b"Consistent",
    b"murmur2\x00",
    b"1",
    b"2",
    b"01",
    b"0",
    b"",
    b" 1",
    b"1 ",
    b"+1",
    "\u0661".encode(),
    b"9" * 16,
    b"\xff",
    b"a-p0",
    "1",
    "orders",
]


@pytest.mark.parametrize("index", range(len(_tail)))
@pytest.mark.parametrize("value", _HOSTILE_VALUES)
def test_each_tail_field_with_a_hostile_value_is_read_as_unwrap_reads_it(index, value):
    headers = [("user", b"u"), *_tail]
    headers[index + 1] = (headers[index + 1][0], value)
    tail = plain_tail(headers)
    try:
        envelope, user, _size = unwrap(headers)
    except EnvelopeError:
        assert tail is None
        return
    if tail is not None:
        assert Envelope(*tail[:3], None, tail[3], partitioner=tail[5]) == envelope
        assert tail[4] == user


def test_the_plain_tail_leaves_explicit_partitions_and_cancels_to_the_full_parse():
    with_partition = wrap(Envelope("orders", 5, "abc", 3), [])
    assert plain_tail(with_partition) is None
    assert unwrap(with_partition)[0].partition == 3
    cancel = [("delay-v", b"1"), ("delay-cancel", b"abc")]
    assert plain_tail(cancel) is None
    not_utf8_target = wrap(Envelope("orders", 5, "abc"), [])
    not_utf8_target[1] = ("delay-target", b"\xff\xfe")
    assert plain_tail(not_utf8_target) is None
