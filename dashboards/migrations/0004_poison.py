"""Issue 11 (poison events): rollup hours that summed a cost stored before the caps of
docs/limits.md (Infinity, or past anything the capped costs can add up to) are marked dirty. The
overview then reads them live from the runs, whose costs ingest's migration 0011_poison capped, and
the next rollup pass builds them again."""

from django.db import migrations
from django.db.models import Q

# A run's costs are capped at 1e15 (ingest.detection.bounds.MAX_TOTAL_USD): an hour past this holds
# more runs at that cap than any hour of a real deployment; NaN compares above it in PostgreSQL.
SANE_HOUR_USD = 1e18


def hours_dirty(apps, schema_editor) -> None:
    RunRollup = apps.get_model("dashboards", "RunRollup")
    RollupHour = apps.get_model("dashboards", "RollupHour")
    past = Q(cost__gt=SANE_HOUR_USD) | Q(success_cost__gt=SANE_HOUR_USD) | Q(burned__gt=SANE_HOUR_USD)
    hours = RunRollup.objects.filter(past).values("hour")
    RollupHour.objects.filter(hour__in=hours).update(dirty=True)


class Migration(migrations.Migration):
    dependencies = [
        ("dashboards", "0003_overview_rollup"),
        ("ingest", "0011_poison"),
    ]

    operations = [migrations.RunPython(hours_dirty, migrations.RunPython.noop)]
