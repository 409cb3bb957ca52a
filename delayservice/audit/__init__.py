"""The delivery audit: a PySpark job that proves, from Kafka alone, that nothing was lost or early.

It reads both sides of every delayed message, what the delay topics accepted and what
the target topics received, and reconciles them by `delay-id`. The daemon's own counters
are not consulted, so a bug in the daemon cannot hide itself. PySpark is imported only
inside functions: `delayservice --help` must stay fast on machines without the `audit`
extra installed.
"""

from __future__ import annotations

from delayservice.envelope import H_CANCEL
from delayservice.errors import DelayServiceError

__all__ = [
    "EXIT_OK",
    "EXIT_VIOLATIONS",
    "H_CANCEL",
    "INSTALL_EXTRA",
    "PRECISE_LEVEL",
    "AuditError",
]

INSTALL_EXTRA = (
    "install the audit extra from a checkout: pip install '.[audit]' "
    "(or a built wheel: pip install 'dist/delayservice-<version>-<tags>.whl[audit]')"
)
"""The install that works: the package is not published on an index."""


PRECISE_LEVEL = "exact"
"""The level name of the precise topic's messages, the label the daemon's metrics give
precise mode (`delayservice.precise.precise_worker.LEVEL_NAME`), so the audit's rows line
up with the dashboards. No level can be called that: level names are durations."""

EXIT_OK = 0
EXIT_VIOLATIONS = 3
"""Exit status when a promise is broken: 1 and 2 already mean 'could not run' and 'bad settings'."""


class AuditError(DelayServiceError):
    """The audit could not run: Spark, Java, the connector jars or the input are not usable."""
