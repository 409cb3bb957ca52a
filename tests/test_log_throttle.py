import logging

from delayservice.kafka.client_config import librdkafka_logger
from delayservice.log_throttle import RepeatFilter, Throttle


def test_a_throttle_lets_the_first_line_through_and_counts_the_rest():
    throttle = Throttle(every_s=3600)
    assert throttle.allow("a") == 0
    assert throttle.allow("a") is None
    assert throttle.allow("a") is None
    assert throttle.allow("b") == 0  # keys are independent


def test_repeats_that_differ_only_in_numbers_are_dropped():
    dropped = RepeatFilter(every_s=3600)

    def line(text: str) -> logging.LogRecord:
        return logging.LogRecord("x", logging.ERROR, __file__, 1, text, None, None)

    assert dropped.filter(line("Connect to 127.0.0.1:9092 failed (after 0ms)"))
    assert not dropped.filter(line("Connect to 127.0.0.1:9092 failed (after 12ms)"))
    assert dropped.filter(line("Disconnected from 127.0.0.1:9092"))


def test_the_librdkafka_logger_gets_one_filter_however_often_it_is_asked_for():
    librdkafka_logger()
    logger = librdkafka_logger()
    assert sum(isinstance(f, RepeatFilter) for f in logger.filters) == 1
