"""Whether this run is CI's, decided in one place: there, a test that cannot get what it
needs (a broker, a compiled fast path, a tmpfs) fails instead of skipping."""

from __future__ import annotations

import os

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
