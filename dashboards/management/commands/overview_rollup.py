"""Roll up the overview's closed hours now (what the beat task does every minute), all of them."""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand
from django.utils import timezone

from dashboards.overview.rollup import rollup_clear, rollup_pass


class Command(BaseCommand):
    help = (
        "Roll up every closed hour that needs it (no per-pass limit). --rebuild forgets the rollup "
        "first: after data was changed behind loopwatch's back (a restore, a bulk UPDATE)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--rebuild", action="store_true", help="delete the rollup and build it again")

    def handle(self, *args, rebuild: bool = False, **options) -> None:
        began = time.perf_counter()
        if rebuild:
            rollup_clear()
        hours = rollup_pass(now=timezone.now(), max_hours=None)
        self.stdout.write(f"{hours} hours rolled up in {time.perf_counter() - began:.1f} s")
