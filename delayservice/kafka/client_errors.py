"""What a confluent-kafka exception says about the client that raised it.

librdkafka marks a client unusable with a *fatal* error, and confluent-kafka passes it
on in more than one shape: the transaction API raises it with `fatal()` set; a fatal
error event, which librdkafka hands to the error callback, is raised instead from the
`poll()` or `flush()` that serves it, also with `fatal()` set; and every later
`produce()` is refused with the code `_FATAL`, whose `fatal()` is *not* set (produce()
errors never carry the flag, nor do delivery reports). So fatal means either.

Two shapes are broken. A call can fail having lost its exception (`lost_client_error`);
and a call can leave a bare `KafkaError`, which is not an exception class, set as the
exception itself (confluent-kafka 2.16.1's `flush` at a fence, beside CPU hogs: it
went through every `except Exception` and ended the forwarder's thread). No `except`
naming a class matches that one, so the loops that must never stop run their calls
through `raised_by`, whose bare `except:` takes it as the `KafkaException` it should
have been (`raised_as_exception`), and handle what it returns out of any `except`
block: raising inside one would chain the new exception to an object that is not one.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Final

from confluent_kafka import KafkaError, KafkaException

TEXT_MAX: Final = 300
"""The most of an exception's text a line repeats (`told`): a client's message can be
any length, from a broker or a librdkafka debug line, and a readiness answer or a
stderr notice should stay one readable line."""

STARTING_CODES: Final = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
    }
)
"""What a fresh broker answers for a while as it loads its offsets log, and a topic
just created until its leaders are elected: INFO, not a WARNING, until it has lasted
longer than a start-up takes (`kafka.log_levels.GraceStreaks`)."""


def is_fatal(error: KafkaError) -> bool:
    """Whether the client that raised or reported `error` is unusable."""
    return bool(error.fatal()) or error.code() == KafkaError._FATAL


def error_of(exc: BaseException) -> KafkaError | None:
    """The `KafkaError` a `KafkaException` carries, if any."""
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


def fatal_error_in(exc: BaseException) -> KafkaError | None:
    """A fatal `KafkaError` carried by `exc` or by what caused it. A client that went
    fatal inside a callback (a producer fenced during `flush`) can surface it later as
    a `SystemError` from an unrelated call, the `KafkaException` as its cause."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return None
        error = error_of(seen)
        if error is not None and is_fatal(error):
            return error
        seen = seen.__cause__ or seen.__context__
    return None


def lost_client_error(exc: BaseException) -> bool:
    """Whether `exc` is confluent-kafka's `SystemError` for a client call that failed and
    lost its exception (`<method 'flush' of 'cimpl.Producer' objects> returned NULL
    without setting an exception`), seen when a transactional producer is fenced while
    its flush serves the callbacks. Nothing is known of the cause; the client's next
    call raises it again."""
    text = str(exc)
    return isinstance(exc, SystemError) and "cimpl." in text and "without setting" in text


def told(exc: BaseException) -> str:
    """`repr(exc)`, cut to `TEXT_MAX` characters with how many were left out."""
    text = repr(exc)
    if len(text) <= TEXT_MAX:
        return text
    return f"{text[:TEXT_MAX]}... ({len(text) - TEXT_MAX} more characters)"


def raised_as_exception() -> Exception:
    """Inside a bare `except:`, what was raised, as an exception: a bare `KafkaError`
    as the `KafkaException` carrying it; anything else not an exception, described."""
    value = sys.exc_info()[1]
    if isinstance(value, KafkaError):
        return KafkaException(value)
    if isinstance(value, Exception):
        return value
    return RuntimeError(f"a client call raised {value!r}, which is not an exception")


def raised_by(call: Callable[[], object]) -> Exception | None:
    """Run `call`; what it raised, as an exception, or None. `KeyboardInterrupt` and
    the like pass through."""
    try:
        call()
    except Exception as exc:
        return exc
    except BaseException:
        raise
    except:  # noqa: E722 - a bare KafkaError (see the module's docstring)
        return raised_as_exception()
    return None
