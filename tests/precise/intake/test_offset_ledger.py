from delayservice.precise.intake.offset_ledger import LevelLedger


def test_commit_waits_for_the_lowest_unsettled_offset():
    level = LevelLedger()
    p0 = level.assign(0)
    for offset in (10, 11, 12, 13):
        level.track(p0, offset, 100)
    assert p0.committable() == 10
    level.settle(p0, 11, 100)
    level.settle(p0, 12, 100)
    assert p0.committable() == 10  # 10 is not acknowledged yet
    level.settle(p0, 10, 100)
    assert p0.committable() == 13
    level.settle(p0, 13, 100)
    assert p0.committable() == 14  # everything settled: the next offset to read
    assert level.total_buffered == 0
    assert level.total_bytes == 0


def test_nothing_consumed_commits_nothing():
    level = LevelLedger()
    level.assign(3)
    assert level.to_commit() == []


def test_to_commit_reports_only_moves():
    level = LevelLedger()
    p0 = level.assign(0)
    level.track(p0, 5, 1)
    level.settle(p0, 5, 1)
    assert level.to_commit() == [(0, 6)]
    level.committed([(0, 6)])
    assert level.to_commit() == []


def test_revoked_partitions_stop_counting_and_ignore_late_acks():
    level = LevelLedger()
    p0, p1 = level.assign(0), level.assign(1)
    level.track(p0, 1, 10)
    level.track(p1, 1, 20)
    assert level.revoke(0) is p0
    assert (level.total_buffered, level.total_bytes) == (1, 20)
    level.settle(p0, 1, 10)  # the ack arrives after the revoke
    assert (level.total_buffered, level.total_bytes) == (1, 20)
    assert [p for p, _ in level.to_commit()] == [1]


def test_peaks_are_recorded():
    level = LevelLedger()
    p0 = level.assign(0)
    for offset in range(5):
        level.track(p0, offset, 10)
    for offset in range(5):
        level.settle(p0, offset, 10)
    assert level.peak_partition_buffered == 5


def test_rewind_forgets_a_failed_batch_and_keeps_what_came_before():
    ledger = LevelLedger()
    p = ledger.assign(0)
    ledger.track_many({p: [0, 1, 2, 3, 4]})
    ledger.settle_many([(p, 0), (p, 1), (p, 3)])  # 2 is a dead letter still in flight
    ledger.track_many({p: [5, 6, 7]})  # the batch that fails
    ledger.settle_many([(p, 6)])
    ledger.rewind({0: 5})
    assert p.next_offset == 5
    assert p.buffered == ledger.total_buffered == 2  # offsets 2 and 4
    assert ledger.to_commit() == [(0, 2)]
    ledger.settle_many([(p, 2), (p, 4)])
    assert ledger.to_commit() == [(0, 5)], "a rewound batch must not be committed past"
    ledger.track_many({p: [5, 6, 7]})  # read again
    ledger.settle_many([(p, 5), (p, 6), (p, 7)])
    assert ledger.to_commit() == [(0, 8)]
    assert p.buffered == ledger.total_buffered == 0


def test_rewind_ignores_partitions_no_longer_held():
    ledger = LevelLedger()
    p = ledger.assign(0)
    ledger.track_many({p: [0, 1]})
    ledger.rewind({0: 0, 3: 7})
    assert p.next_offset == 0
    assert ledger.to_commit() == [(0, 0)]
