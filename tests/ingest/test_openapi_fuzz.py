"""Schemathesis against the live OpenAPI document: no generated request, valid or not, gets a 5xx.

Each operation of GET /api/v1/schema is a test of its own: a real uvicorn on the test database
answers LOOPWATCH_FUZZ_EXAMPLES (default 40) positive and negative cases per operation, sent with a
key holding every scope. Hypothesis is derandomised, so CI sees the same cases each run;
LOOPWATCH_FUZZ_RANDOM=1 explores other cases (LOOPWATCH_FUZZ_EXAMPLES=500 found what the suite
knows of; about 80 s for 40 examples an operation on a busy 2-core machine).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from ingest.models import ApiKey
from ingest.services import api_key_create, tenant_get_or_create
from tests.live import uvicorn_serve

EXAMPLES = int(os.environ.get("LOOPWATCH_FUZZ_EXAMPLES", "40"))
RANDOM = os.environ.get("LOOPWATCH_FUZZ_RANDOM") == "1"


def _operations() -> list[str]:
    """'METHOD /path' of every operation, from the document the server serves (built here)."""
    from drf_spectacular.generators import SchemaGenerator

    document = SchemaGenerator().get_schema(request=None, public=True)
    return [
        f"{method.upper()} {path}"
        for path, methods in document["paths"].items()
        for method in methods
        if method in ("get", "post", "put", "patch", "delete")
    ]


@pytest.fixture(scope="module")
def server(django_db_setup, tmp_path_factory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("fuzz")
    # A key looked up on every request: each test's tables are emptied after it.
    with uvicorn_serve(folder / "uvicorn.log", LOOPWATCH_KEY_CACHE_S="0") as (url, _):
        yield url


@pytest.fixture(scope="module")
def schema(server):
    return schemathesis.openapi.from_url(server + "/api/v1/schema")


@pytest.mark.parametrize(
    "label",
    _operations(),
)
def test_no_request_gets_a_server_error(label, server, schema, transactional_db):
    method, path = label.split(" ", 1)
    operation = schema[path][method]
    tenant = tenant_get_or_create(slug="fuzz")
    _, key = api_key_create(tenant=tenant, scopes=list(ApiKey.Scope.values))
    headers = {"Authorization": f"Bearer {key}"}
    cases = st.one_of(
        operation.as_strategy(generation_mode=GenerationMode.POSITIVE),
        operation.as_strategy(generation_mode=GenerationMode.NEGATIVE),
    )

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=not RANDOM,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=cases)
    def no_server_error(case) -> None:
        response = case.call(base_url=server, headers=headers, timeout=30)
        case.validate_response(response, checks=[schemathesis.checks.not_a_server_error])

    no_server_error()
