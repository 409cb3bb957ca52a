"""What the markers reader keeps at hand instead of working it out again for every marker
of a flood: the fewest and most partitions of the level topics, each level partition's
markers homes, the offset a markers partition was last read in order to, and a
marker's answer key (made when first asked for). Each test fails if what is kept goes
stale: a level topic grown or made again, a markers topic grown, a misplaced home
found mid-batch, a marker re-read.

On fakes, one reader pass at a time (`marker_reading`), or the pieces alone.
"""

from __future__ import annotations

import dataclasses

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME

from delayservice.level.markers import store as st
from delayservice.level.markers.filing import marker_of
from delayservice.level.markers.placing import REFUSED, Placing
from delayservice.level.markers.verdict import LevelMarker
from delayservice.markers.level_ids import level_id
from delayservice.markers.replies import CANCEL, RESCHEDULE, reply_key
from tests.level.fakes import LEVELS, message
from tests.level.markers.reading import Reading, cancel_on, reading_rig

NOW = 1_764_000_000_000


def _misplaced(reading: Reading) -> float:
    return reading.reader.filing._metrics.level_markers_misplaced._value.get()


def test_the_counts_kept_follow_every_level_topic_grown_or_made_again() -> None:
    placing = Placing(LEVELS)
    first, second = (level.topic for level in LEVELS.levels[:2])
    names = {(level, p): level_id(level, p, NOW) for level in (1, 2) for p in (2, 3)}
    assert (placing.fewest, placing.most) == (0, 0), "nothing counted: every partition"
    placing.partition_count(first, 3)
    placing.partition_count(second, 3)
    assert placing.beyond_count(names[1, 3])
    assert (placing.fewest, placing.most) == (3, 3)
    placing.partition_count(first, 4)  # grown
    assert (placing.fewest, placing.most) == (3, 4)
    assert not placing.beyond_count(names[1, 3])
    assert placing.beyond_count(names[2, 3])
    placing.partition_count(second, 4)
    assert (placing.fewest, placing.most) == (4, 4)
    assert not placing.beyond_count(names[2, 3])
    placing.partition_count(first, 2)  # deleted and made again, smaller
    assert (placing.fewest, placing.most) == (2, 4)
    assert placing.beyond_count(names[1, 3]), "still taken for the count before"
    assert placing.beyond_count(names[1, 2])
    assert not placing.beyond_count(names[2, 2])
    placing.partition_count(second, 3)  # the widest made again, smaller
    assert (placing.fewest, placing.most) == (2, 3)
    with pytest.raises(TypeError):
        placing.partitions[first] = 9  # type: ignore[index]  # only `partition_count`


@pytest.fixture
def reading(monkeypatch: pytest.MonkeyPatch) -> Reading:
    return reading_rig(monkeypatch, markers_partitions=3)


def test_a_marker_of_a_level_partition_added_mid_flood_is_placed_and_its_home_learnt(
    reading: Reading,
) -> None:
    """The level topic grows between two batches of a flood: a cancel naming the new
    partition, on a markers partition that is not its home, is kept for that partition
    (not refused) and its markers partition is waited for from then on."""
    level = reading.reader.filing.level_topics[0]
    flood = [cancel_on(reading, p % 3, names=p % 3) for p in range(30)]
    reading.one_pass()
    assert all(reading.book.has(mid) for mid in flood)
    assert reading.book.partitions[level] == 3
    reading.grow(level, 4)
    mid = cancel_on(reading, 1, names=3)  # its home is 3 % 3 = 0
    reading.one_pass()
    assert reading.book.partitions[level] == 4
    (entry,) = reading.book.entries((level, 3))
    assert (entry.marker.message_id, entry.refusal) == (mid, None)
    assert reading.gate.home_of(3) == (0, 1), "the markers partition it was on is not waited for"
    assert _misplaced(reading) == 1


def test_a_misplaced_home_found_mid_batch_is_honoured_by_the_rest_of_the_batch(
    reading: Reading,
) -> None:
    """Three cancels of level partition 1 on markers partition 2 in one batch: the
    first makes 2 a home of 1; the next two are on a home, not misplaced again."""
    for _ in range(3):
        cancel_on(reading, 2, names=1)
    reading.one_pass()
    assert reading.gate.home_of(1) == (1, 2)
    assert _misplaced(reading) == 1, "counted for every marker: the homes went stale"


def test_the_homes_follow_a_markers_topic_grown(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every level partition's home is markers partition 0 while the topic has one; grown
    to three, level partition 1's markers go to 1, and one there is on its home."""
    reading = reading_rig(monkeypatch)
    cancel_on(reading, 0, names=1)
    reading.one_pass()
    assert reading.gate.home_of(1) == (0,)
    reading.grow(reading.markers, 3)
    reading.one_pass()
    assert reading.gate.home_of(1) == (0, 1), "an earlier count's home, and the new one"
    mid = cancel_on(reading, 1, names=1)
    reading.one_pass()
    assert reading.book.has(mid)
    assert _misplaced(reading) == 0, "taken as misplaced on the homes before the growth"


def test_a_markers_partition_finds_what_it_kept_through_late_reads_and_cuts() -> None:
    """`Source.last` stands for the offset of its last slot in order: a re-read at or
    below it is looked for (kept once), one above it is new."""
    offsets: dict[int, int] = {}
    source = st.Source()

    def add(slot: int, offset: int) -> None:
        offsets[slot] = offset
        source.add(offset, slot)

    def find(offset: int, base: int = 0) -> int:
        return source.find(offset, offsets.__getitem__, base)

    for slot, offset in enumerate((3, 5, 9)):
        add(slot, offset)
        assert find(offset) == slot, "the last one added not found: a re-read kept twice"
    assert (find(4), find(10)) == (-1, -1)
    add(3, 4)  # below the last: read again after a rewind
    assert (find(4), find(9), find(10)) == (3, 2, -1)
    add(4, 12)
    assert (find(12), find(11)) == (4, -1)
    source.cut(4)  # slots 0 to 3 are gone
    assert (find(12, base=4), find(9, base=4)) == (4, -1)
    source.cut(5)  # all gone
    add(5, 1)
    assert (find(1, base=5), find(12, base=5)) == (5, -1)


def test_a_markers_answer_key_made_when_asked_changes_nothing_else_about_it() -> None:
    marker = LevelMarker(CANCEL, "abc", NOW, "markers", 2, 7)
    twin = LevelMarker(CANCEL, "abc", NOW, "markers", 2, 7)
    assert marker.key == reply_key("markers", 2, 7) == b"markers:2:7"
    assert marker == twin, "the key made on one only"
    assert hash(marker) == hash(twin)
    assert repr(marker) == repr(twin)
    assert "key" not in repr(marker)
    assert twin.key == marker.key
    with pytest.raises(dataclasses.FrozenInstanceError):
        marker.kind = RESCHEDULE  # type: ignore[misc]


def _read(*headers: tuple[str, bytes | None]) -> tuple[LevelMarker, tuple[str, str] | None]:
    record = message(
        0,
        4,
        NOW,
        topic="markers",
        headers=list(headers),
        timestamp_type=TIMESTAMP_CREATE_TIME,
    )
    read = marker_of(record)
    assert read is not None
    return read


def test_the_headers_read_in_one_pass_give_what_a_look_for_each_name_gave() -> None:
    """A cancel wins over a reschedule wherever it is; of a repeated name, the first
    counts, even when it holds nothing."""
    marker, refusal = _read(("delay-reschedule", b"r"), ("delay-ms", b"5"), ("delay-cancel", b"c"))
    assert (marker.kind, marker.message_id, refusal) == (CANCEL, "c", None)
    marker, _ = _read(("delay-cancel", b"first"), ("delay-cancel", b"second"))
    assert marker.message_id == "first"
    marker, _ = _read(("delay-reschedule", b"r1"), ("delay-reschedule", b"r2"), ("delay-ms", b"5"))
    assert (marker.kind, marker.message_id, marker.asked_due_ms) == (RESCHEDULE, "r1", NOW + 5)
    marker, refusal = _read(("delay-cancel", None), ("delay-cancel", b"x"))
    assert refusal is not None
    assert refusal[0] == REFUSED
    assert "without an id" in refusal[1]
