"""The Celery app. Broker and eager mode come from settings (REDIS_URL)."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "loopwatch.settings")

app = Celery("loopwatch")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
