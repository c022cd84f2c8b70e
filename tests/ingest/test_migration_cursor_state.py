"""Migration 0019 turns the engine state from jsonb into JSON text (ingest.models.JSONText) and
back, the states kept; the column is compressed with lz4 where the server has it."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction
from django.db.migrations.executor import MigrationExecutor

from ingest.models import Run, RunCursor, Tenant

pytestmark = pytest.mark.django_db(transaction=True)
BEFORE, AFTER = ("ingest", "0018_transition_operator_reference"), ("ingest", "0019_cursor_state_text")
STATE = {
    "version": 2,
    "events": 7,
    "recent": [{"sig": "ab", "args": {"q": 'a "quoted" \\ value', "n": 2**62}}],
}


def _migrate(target: tuple[str, str]) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([target])


def _column() -> tuple[str, str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT format_type(atttypid, atttypmod), attcompression FROM pg_attribute "
            "WHERE attrelid = 'ingest_runcursor'::regclass AND attname = 'engine_state'"
        )
        return cursor.fetchone()


def _server_has_lz4() -> bool:
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("CREATE TEMP TABLE lz4_probe (x text COMPRESSION lz4)")
            transaction.set_rollback(True)
        return True
    except DatabaseError:
        return False


def test_the_states_survive_the_migration_and_its_reverse(needs_postgres):
    try:
        _migrate(BEFORE)
        run = Run.objects.create(tenant=Tenant.objects.create(slug="acme"), run_id="r1", events_count=7)
        with connection.cursor() as cursor:  # as 0018 stored it: jsonb
            cursor.execute(
                "INSERT INTO ingest_runcursor (run_id, position, processed, engine_state, updated_at, failures, error) "
                "VALUES (%s, 7, 7, %s::jsonb, now(), 0, '')",
                [
                    run.pk,
                    '{"version": 2, "events": 7, "recent": [{"sig": "ab", "args": '
                    '{"q": "a \\"quoted\\" \\\\ value", "n": 4611686018427387904}}]}',
                ],
            )
        assert _column()[0] == "jsonb"

        _migrate(AFTER)
        assert _column() == ("text", "l" if _server_has_lz4() else "")
        # Only the state: the model's later columns (0020 on) are not there yet.
        assert RunCursor.objects.only("engine_state").get(run=run).engine_state == STATE

        RunCursor.objects.filter(run=run).update(engine_state={**STATE, "events": 8})
        _migrate(BEFORE)
        assert _column()[0] == "jsonb"
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT engine_state->>'events', engine_state->'recent'->0->'args'->>'q' "
                "FROM ingest_runcursor WHERE run_id = %s",
                [run.pk],
            )
            assert cursor.fetchone() == ("8", 'a "quoted" \\ value')
    finally:
        # Back to the newest migrations, not just this one: the tests after this one run on them.
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    assert _column()[0] == "text"


def test_a_state_holding_an_integer_past_64_bits_is_stored_and_read_back(needs_postgres):
    """A hostile argument lands in the engine state: orjson refuses it, the field writes it as a float
    (ingest.bulk.dumps_bounded) rather than fail the pass."""
    run = Run.objects.create(tenant=Tenant.objects.create(slug="acme"), run_id="r1")
    RunCursor.objects.create(run=run, engine_state={"recent": [{"args": {"n": 2**70}}]})
    assert RunCursor.objects.get(run=run).engine_state == {"recent": [{"args": {"n": float(2**70)}}]}
    with connection.cursor() as cursor:
        cursor.execute("SELECT engine_state::jsonb->'recent'->0->'args'->>'n' FROM ingest_runcursor")
        assert float(cursor.fetchone()[0]) == float(2**70)


def test_a_pass_stores_the_states_in_binary_and_a_database_gone_is_djangos_error(needs_postgres):
    """_positions_save sends the states with a psycopg cursor of its own (server-side binding): what it
    stores reads back through the ORM, and a connection the server dropped raises Django's
    OperationalError (the pass lets it go up: not the runs' fault), not psycopg's."""
    import psycopg
    from django.db import OperationalError
    from django.utils import timezone

    from ingest.services.pipeline import _positions_save

    run = Run.objects.create(tenant=Tenant.objects.create(slug="acme"), run_id="r1")
    RunCursor.objects.create(run=run)
    position = {"run_id": run.pk, "position": 3, "processed": 3, "engine_state": STATE}
    with transaction.atomic():
        _positions_save(timezone.now(), [position])
    cursor = RunCursor.objects.get(run=run)
    assert (cursor.position, cursor.processed, cursor.engine_state) == (3, 3, STATE)

    with connection.cursor() as c:
        c.execute("SELECT pg_backend_pid()")
        (pid,) = c.fetchone()
    params = {
        k: v for k, v in connection.get_connection_params().items() if k in ("dbname", "user", "host", "port")
    }
    try:
        with psycopg.connect(**params, autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(%s)", [pid])
        with pytest.raises(OperationalError):
            _positions_save(timezone.now(), [{**position, "position": 4}])
    finally:
        connection.close()
    assert RunCursor.objects.get(run=run).position == 3
