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


def _stored_after_statistics(model, make, tenant, other_tenant) -> list:
    """3,000 rows of `tenant` (make(tenant, i)), stored after statistics of `model`'s table that saw
    only other_tenant's 5,000."""
    model.objects.bulk_create([make(other_tenant, i) for i in range(5000)])
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {model._meta.db_table}")
    return model.objects.bulk_create([make(tenant, i) for i in range(3000)])


@pytest.fixture
def new_tenant_runs(needs_postgres, tenant, other_tenant) -> list[Run]:
    runs = _stored_after_statistics(
        Run, lambda owner, i: Run(tenant=owner, run_id=f"run-{i}"), tenant, other_tenant
    )
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
    def operation(owner, i):
        return Operation(tenant=owner, operation_key=f"k-{i}", tool="t", fingerprint="f")

    _stored_after_statistics(Operation, operation, tenant, other_tenant)
    # as ingest.ledger.claims locks it for a claim, a renewal, a result
    with transaction.atomic():
        plan = Operation.objects.select_for_update().filter(of_tenant(tenant), operation_key="k-5").explain()
    assert "operation_tenant_key_uniq" in plan, plan
