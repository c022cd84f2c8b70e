#!/usr/bin/env python
"""Django's command-line entry point for loopwatch."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "loopwatch.settings")
    from django.conf import settings
    from django.core.management import execute_from_command_line

    # Django keeps a settings error for `help` and goes on to fail with "Models aren't loaded yet":
    # read the settings first, so that a bad or missing variable stops here with its own message.
    settings.INSTALLED_APPS  # noqa: B018

    execute_from_command_line(sys.argv)
