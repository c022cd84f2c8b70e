"""The run's figures counted by the detection pass, not by ingest: how far they go.

Until now ingest added every event to its run's figures (rounds, tool calls, errors, tokens, cost,
first and last event) as it stored it; the detection pass counts them from now on, each event once,
and RunCursor.figures_seq says up to which seq a run's figures hold its events. Every event stored
before this migration was counted by ingest: figures_seq starts at the run's events_count.
"""

from django.db import migrations, models


def counted_by_ingest(apps, schema_editor):
    schema_editor.execute(
        "UPDATE ingest_runcursor SET figures_seq = "
        "(SELECT events_count FROM ingest_run WHERE ingest_run.id = ingest_runcursor.run_id)"
    )


class Migration(migrations.Migration):
    dependencies = [("ingest", "0019_cursor_state_text")]

    operations = [
        migrations.AddField(
            model_name="runcursor",
            name="figures_seq",
            field=models.PositiveIntegerField(
                default=0,
                help_text=(
                    "Events with seq <= figures_seq are counted in the run's figures (rounds, calls, "
                    "tokens, cost): a run processed again from its first event is not counted twice."
                ),
            ),
        ),
        migrations.RunPython(counted_by_ingest, migrations.RunPython.noop),
    ]
