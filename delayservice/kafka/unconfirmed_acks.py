"""Successes librdkafka inferred rather than heard from the broker, for a producer that
asks only for failure reports.

An idempotent producer that lost track of a request (a timeout, a lost connection, an
error on a topic being deleted) counts it delivered once a later request on the same
partition succeeds (`IMPLICITACK`), or once the broker calls a retry a duplicate
(`DUPSEQ`). That inference holds within one partition's life, not across a topic
deleted and re-created under the same name: the new partition accepts the later
request while the earlier records were never written. Such successes carry no offset,
which a per-record delivery report shows; a producer with
`delivery.report.only.error` reports no success at all, so the only trace left is
librdkafka's own debug line, in its `eos` context. This watch turns that context on
and counts those lines, so the level forwarder can send its open interval again (a
duplicate keeps its `delay-id`; a loss could not be found again).

The `eos` context logs a few lines per producer id change and per transaction, none
per record.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Final

from delayservice.kafka.client_lines import ClientLines

INFERRED: Final = frozenset({"IMPLICITACK", "DUPSEQ"})
"""librdkafka's log facilities for a success without the broker's offset."""
CONTEXT: Final = "eos"


class UnconfirmedAcks(ClientLines):
    """A `logger` for confluent-kafka: counts inferred successes and passes every other
    line on. Lines at DEBUG are passed on only when the user asked librdkafka for
    debug output; otherwise they are the `eos` context turned on here, and dropped."""

    def __init__(self, logger: Any, *, pass_debug: bool) -> None:
        super().__init__(logger)
        self._pass_debug = pass_debug
        self._lock = threading.Lock()
        self._count = 0
        self._last = ""

    def _line(self, level: int, msg: str, *args: Any) -> None:
        if len(args) == 3 and args[0] in INFERRED:
            with self._lock:
                self._count += 1
                self._last = f"{args[0]}: {args[2]}"
        if level > logging.DEBUG or self._pass_debug:
            self._logger.log(level, msg, *args)

    def take(self) -> tuple[int, str]:
        """How many inferred-success lines came since the last call, and the last one."""
        with self._lock:
            count, last = self._count, self._last
            self._count, self._last = 0, ""
        return count, last


def watch_unconfirmed(config: dict[str, Any]) -> UnconfirmedAcks:
    """Add librdkafka's `eos` debug context to `config` (keeping the user's own) and
    route the producer's log lines through the returned watch."""
    asked = str(config.get("debug") or "")
    contexts = [c.strip() for c in asked.split(",") if c.strip()]
    if CONTEXT not in contexts and "all" not in contexts:
        contexts.append(CONTEXT)
    config["debug"] = ",".join(contexts)
    logger = config.get("logger") or logging.getLogger(__name__)
    watch = UnconfirmedAcks(logger, pass_debug=bool(asked))
    config["logger"] = watch
    return watch
