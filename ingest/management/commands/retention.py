"""manage.py retention: one retention pass now (what the hourly beat task does)."""

from __future__ import annotations

from django.core.management.base import BaseCommand
from django.utils import timezone

from ingest.retention import retention_apply


class Command(BaseCommand):
    help = (
        "Make the events partitions ahead and drop or purge what is past its retention (PostgreSQL); "
        "delete the events of runs past their retention (SQLite). Prints what it did."
    )

    def handle(self, *args, **options):
        report = retention_apply(now=timezone.now())
        for line in report.lines():
            self.stdout.write(line)
