"""The detection engine's state as JSON text, not jsonb (ingest.models.JSONText).

A detection pass writes the state of every run it processed: for 1,000 runs of a few events each
(an OpenTelemetry collector's batch) 4 MB of JSON, which PostgreSQL parsed into jsonb in 176 ms of
a 190 ms statement. Text is stored as it comes. On PostgreSQL the column is compressed with lz4
where the server has it (PostgreSQL 14+ built with lz4; pglz, the default, took ~70 µs a state):
only values written from then on; a state is rewritten at its run's next pass.
"""

from django.db import migrations

import ingest.models


def compress_lz4(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(
        """
        DO $$ BEGIN
            ALTER TABLE ingest_runcursor ALTER COLUMN engine_state SET COMPRESSION lz4;
        EXCEPTION WHEN feature_not_supported THEN
            NULL;  -- a server built without lz4 keeps pglz
        END $$
        """
    )


def compress_default(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE ingest_runcursor ALTER COLUMN engine_state SET COMPRESSION DEFAULT")


class Migration(migrations.Migration):
    dependencies = [("ingest", "0018_transition_operator_reference")]

    operations = [
        migrations.AlterField(
            model_name="runcursor",
            name="engine_state",
            field=ingest.models.JSONText(blank=True, help_text="The detection engine's RunState (JSON).", null=True),
        ),
        migrations.RunPython(compress_lz4, compress_default),
    ]
