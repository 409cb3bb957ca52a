"""The daemon's main thread runs its SIGTERM handler wherever the kernel delivers it.

Kept apart from `test_daemon.py` (which needs a broker): a daemon that was never
started stops the same way, so no broker is involved.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import logging, signal, sys, threading
    from delayservice.daemon import Daemon, install_signal_handlers
    from delayservice.settings import Settings

    logging.basicConfig(level=logging.INFO)
    daemon = Daemon(Settings(bootstrap_servers="127.0.0.1:9"))
    install_signal_handlers(daemon)
    started = threading.Event()

    def another_thread():
        started.set()
        threading.Event().wait(60)

    other = threading.Thread(target=another_thread, daemon=True)
    other.start()
    started.wait()
    # What the kernel may do with a process-directed SIGTERM: hand it to any thread
    # that does not block it, here not the main one.
    signal.pthread_kill(other.ident, signal.SIGTERM)
    sys.exit(daemon.wait())
    """
)


def test_a_sigterm_delivered_to_another_thread_still_stops_the_daemon():
    # Before the fix the main thread slept through it: this run would time out.
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], check=False, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert "received SIGTERM, stopping" in done.stderr
