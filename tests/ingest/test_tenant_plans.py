"""Statements that find a tenant's runs keep the plan that finds each run by its key when the
statistics counted none of the tenant's runs: a tenant new since the last ANALYZE (autovacuum's next
one comes after a tenth of the table has changed), and so do the ledger's lookups of a tenant's
operations by key. Given the tenant as a constant, the planner took such a tenant for a handful of
rows and read all its runs (operations) through an index on tenant_id, for every batch, export,
guard check and claim (ingest.bulk.TENANT_PK, of_tenant)."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from ingest.bulk import of_tenant
from ingest.guard.check import _RUN_VIEW_SQL
from ingest.models import Operation, Run
from ingest.otlp.service import _RUNS_SQL, _STORED_ROUNDS_SQL
from ingest.services.postgres import _take_sql, json_array, text_array

pytestmark = pytest.mark.django_db(transaction=True)

UNIQUE = "run_tenant_run_id_uniq"


@pytest.fixture
def new_tenant_runs(needs_postgres, tenant, other_tenant) -> list[Run]:
    """3,000 runs of `tenant`, stored after statistics that saw only other_tenant's 5,000."""
    Run.objects.bulk_create([Run(tenant=other_tenant, run_id=f"theirs-{i}") for i in range(5000)])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE ingest_run")
    runs = Run.objects.bulk_create([Run(tenant=tenant, run_id=f"mine-{i}") for i in range(3000)])
    return sorted(runs, key=lambda run: run.pk)[:20]


def _plan(sql: str, params: list) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {sql}", params)
        return "\n".join(line for (line,) in cursor.fetchall())


def test_ingest_locks_the_runs_by_pk(new_tenant_runs):
    plan = _plan(_take_sql()[2], [json_array([run.pk for run in new_tenant_runs])])
    assert "ingest_run_pkey" in plan and "tenant" not in plan, plan


def test_ingest_finds_runs_it_has_not_seen_by_their_ids(new_tenant_runs, tenant):
    plan = _plan(_take_sql()[1], [tenant.pk, text_array([run.run_id for run in new_tenant_runs])])
    assert UNIQUE in plan, plan


def test_a_guard_check_finds_its_run_by_its_id(new_tenant_runs, tenant):
    assert UNIQUE in _plan(_RUN_VIEW_SQL, [tenant.pk, new_tenant_runs[0].run_id])


def test_an_otlp_export_finds_its_runs_by_their_ids(new_tenant_runs, tenant):
    run_ids = [run.run_id for run in new_tenant_runs]
    assert UNIQUE in _plan(_RUNS_SQL, [tenant.pk, run_ids])
    # Joined with the events: by the runs' unique index, or from the events by their own; never by the
    # tenant alone.
    plan = _plan(_STORED_ROUNDS_SQL, [run_ids, [f"otel-{i}" for i in range(20)], tenant.pk])
    assert "Index Cond: (tenant_id = " not in plan, plan


def test_the_api_finds_a_run_by_its_id(new_tenant_runs, tenant):
    # ingest.selectors.run_get, the guard's run by id
    plan = Run.objects.filter(of_tenant(tenant), run_id=new_tenant_runs[0].run_id).explain()
    assert UNIQUE in plan, plan


def test_the_ledger_finds_an_operation_by_its_key(needs_postgres, tenant, other_tenant):
    def operations(owner, count):
        rows = [
            Operation(tenant=owner, operation_key=f"k-{i}", tool="t", fingerprint="f") for i in range(count)
        ]
        Operation.objects.bulk_create(rows)

    operations(other_tenant, 5000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE ingest_operation")
    operations(tenant, 3000)
    # as ingest.ledger.claims locks it for a claim, a renewal, a result
    with transaction.atomic():
        plan = Operation.objects.select_for_update().filter(of_tenant(tenant), operation_key="k-5").explain()
    assert "operation_tenant_key_uniq" in plan, plan
