from __future__ import annotations

import pytest

from ingest.openapi import trace_event_schema

pytestmark = pytest.mark.django_db


def test_the_openapi_schema_carries_the_trace_event_schema(client):
    response = client.get("/api/v1/schema", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    doc = response.json()
    assert doc["openapi"].startswith("3.1")
    assert doc["components"]["schemas"]["TraceEvent"] == trace_event_schema()
    body = doc["paths"]["/api/v1/events"]["post"]["requestBody"]["content"]
    assert body["application/json"]["schema"]["items"] == {"$ref": "#/components/schemas/TraceEvent"}
    assert "application/x-ndjson" in body
    assert doc["components"]["securitySchemes"]["ApiKey"]["scheme"] == "bearer"
    assert {"200", "207", "413", "422"} <= set(doc["paths"]["/api/v1/events"]["post"]["responses"])


def test_an_unknown_api_path_is_a_json_404(client):
    response = client.get("/api/v1/nothing-here")
    assert response.status_code == 404 and response.json()["error"] == "not_found"


def test_the_document_is_valid_openapi(tmp_path):
    from django.core.management import call_command

    # --fail-on-warn raises on any warning; --validate on a document that is not valid OpenAPI.
    call_command("spectacular", "--validate", "--fail-on-warn", file=str(tmp_path / "s.yaml"))
    assert (tmp_path / "s.yaml").read_text().startswith("openapi: 3.1")
