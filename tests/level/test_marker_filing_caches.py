"""What the markers reader keeps at hand instead of working it out again for every marker
of a flood: the fewest and most partitions of the level topics, and each level
partition's markers homes. Each test fails if what is kept goes stale: a level topic
grown or made again, a markers topic grown, a misplaced home found mid-batch.

On fakes, one reader pass at a time (`marker_reading`), or the pieces alone.
"""

from __future__ import annotations

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME

from delayservice.level.marker_filing import marker_of
from delayservice.level.marker_placing import REFUSED, Placing
from delayservice.level.marker_verdict import LevelMarker
from delayservice.markers.level_ids import level_id
from delayservice.markers.replies import CANCEL, RESCHEDULE
from tests.level.fakes import LEVELS, message
from tests.level.marker_reading import Reading, cancel_on, reading_rig

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
