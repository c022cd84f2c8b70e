"""Leave room in each page of ingest_run for the new versions of its rows (PostgreSQL).

Every batch writes the figures of every run it touches. PostgreSQL can write a row's new version
in the same page without touching the table's eight indexes (a HOT update) only when the page has
room for it; the runs of a page are usually active together, so one batch's UPDATE writes a new
version of most rows of a page at once. At the default fillfactor (100) pages were full and three
updates in five moved the row and inserted a new entry in every index: with 1,000 runs per batch
the UPDATE cost PostgreSQL 60 ms of CPU, at 40 % it costs 25 ms (88 % HOT). The table is small
beside the events (a row per run); it grows 2.5 times. New pages use it; an existing table is
repacked by VACUUM FULL (docs/performance.md).
"""

from django.db import migrations

FILLFACTOR = 40


def set_fillfactor(apps, schema_editor, value=FILLFACTOR):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER TABLE ingest_run SET (fillfactor = {int(value)})")


def reset_fillfactor(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE ingest_run RESET (fillfactor)")


class Migration(migrations.Migration):
    dependencies = [("ingest", "0016_partition_events")]

    operations = [migrations.RunPython(set_fillfactor, reset_fillfactor, elidable=False)]
