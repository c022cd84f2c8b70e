"""The detection engine's state is compressed with lz4 instead of pglz (PostgreSQL 14 and later,
when the server was built with lz4).

Every detection pass writes the state of each run it processed (~4 KB of JSON each, compressed
as it is stored): with pglz that was most of the pass's one UPDATE, and lz4 halves it. Rows keep
the compression they were written with until they are written again.
"""

from __future__ import annotations

from django.db import migrations

TABLE_COLUMN = "ingest_runcursor ALTER COLUMN engine_state"


def _lz4_available(cursor) -> bool:
    cursor.execute(
        "SELECT current_setting('server_version_num')::int >= 140000 AND EXISTS ("
        "SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY(enumvals))"
    )
    return bool(cursor.fetchone()[0])


def lz4(apps, schema_editor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        if _lz4_available(cursor):
            cursor.execute(f"ALTER TABLE {TABLE_COLUMN} SET COMPRESSION lz4")


def default(apps, schema_editor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        if _lz4_available(cursor):
            cursor.execute(f"ALTER TABLE {TABLE_COLUMN} SET COMPRESSION default")


class Migration(migrations.Migration):
    dependencies = [("ingest", "0007_detection_agent")]

    operations = [migrations.RunPython(lz4, default, elidable=True)]
