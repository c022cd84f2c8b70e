"""The test suite's settings: loopwatch's own, read from the environment as everywhere, with what a
test run needs when the environment does not say it.

The defaults are set in os.environ, not here as settings, so that the servers, workers and
commands the tests start in subprocesses get them too. Tests serve plain HTTP on 127.0.0.1: the
cookies may not insist on HTTPS there.
"""

from __future__ import annotations

import os

TEST_ENVIRONMENT = {
    "SECRET_KEY": "loopwatch-test-suite-" + "not-a-secret-" * 4,
    "SESSION_COOKIE_SECURE": "false",
    "CSRF_COOKIE_SECURE": "false",
}
for _name, _value in TEST_ENVIRONMENT.items():
    os.environ.setdefault(_name, _value)

from loopwatch.settings import *  # noqa: E402, F403 - after the environment above

# Fast password hashing: the tests sign in by the hundred (the lockout test alone 30 times); the
# strength of a hash is Django's to test, not ours.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
