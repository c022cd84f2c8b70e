"""The test suite's settings: loopwatch's own, read from the environment as everywhere, with what a
test run needs when the environment does not say it.

The defaults are set in os.environ, not here as settings, so that the servers, workers and
commands the tests start in subprocesses get them too. Tests serve plain HTTP on 127.0.0.1: the
cookies may not insist on HTTPS there.
"""

from __future__ import annotations

import os

os.environ.setdefault("SECRET_KEY", "loopwatch-test-suite-" + "not-a-secret-" * 4)
os.environ.setdefault("SESSION_COOKIE_SECURE", "false")
os.environ.setdefault("CSRF_COOKIE_SECURE", "false")

from loopwatch.settings import *  # noqa: F403
