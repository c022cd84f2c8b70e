"""Issue 11 (poison events): detection quarantined per run on its cursor, and the costs stored
before the caps of docs/limits.md brought within them.

RunCursor gains failures, error, failed_at and retry_at (a run whose processing raised waits for its
next try; ingest.services) and a partial index on the quarantined ones. Costs: a round of 1e308 was
accepted before, and a run of three of them summed to Infinity; PostgreSQL's SUM of two such runs
overflowed, and the overview and its rollup failed for every tenant. They are capped as ingest caps
them now (a round at MAX_COST_USD, a run's sums at MAX_TOTAL_USD); NaN compares above every number
in PostgreSQL, so it is capped too. One pass over the runs and the rounds, on columns without an
index: a few seconds per million rows.
"""

from django.db import migrations, models
from django.db.models import Q

MAX_COST_USD = 1_000_000  # ingest.schema.MAX_COST_USD, as of this migration
MAX_TOTAL_USD = 1e15  # ingest.detection.bounds.MAX_TOTAL_USD


def costs_cap(apps, schema_editor) -> None:
    Run = apps.get_model("ingest", "Run")
    ModelRound = apps.get_model("ingest", "ModelRound")
    Run.objects.filter(cost_usd__gt=MAX_TOTAL_USD).update(cost_usd=MAX_TOTAL_USD)
    Run.objects.filter(cost_after_loop_usd__gt=MAX_TOTAL_USD).update(cost_after_loop_usd=MAX_TOTAL_USD)
    ModelRound.objects.filter(cost_usd__gt=MAX_COST_USD).update(cost_usd=MAX_COST_USD)
    # Negative infinity was never accepted (costs had a minimum of 0), but cost nothing to cover.
    Run.objects.filter(Q(cost_usd__lt=0) | Q(cost_after_loop_usd__lt=0)).update(cost_usd=0, cost_after_loop_usd=0)


class Migration(migrations.Migration):

    dependencies = [
        ('ingest', '0010_ledger_attempts'),
    ]

    operations = [
        migrations.AddField(
            model_name='runcursor',
            name='error',
            field=models.TextField(blank=True, default='', help_text='Why the last of them failed.'),
        ),
        migrations.AddField(
            model_name='runcursor',
            name='failed_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='runcursor',
            name='failures',
            field=models.PositiveIntegerField(default=0, help_text='Detection passes in a row that failed on this run; 0: not quarantined.'),
        ),
        migrations.AddField(
            model_name='runcursor',
            name='retry_at',
            field=models.DateTimeField(blank=True, help_text='Quarantined until then.', null=True),
        ),
        migrations.AddIndex(
            model_name='runcursor',
            index=models.Index(condition=models.Q(('failures__gt', 0)), fields=['retry_at'], name='cursor_quarantined'),
        ),
        migrations.RunPython(costs_cap, migrations.RunPython.noop),
    ]
