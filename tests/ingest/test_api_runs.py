"""GET /api/v1/runs a page at a time: the Link header's cursor goes through every run once."""

from __future__ import annotations

import re

import pytest

from ingest.models import Run
from ingest.services import events_ingest

pytestmark = pytest.mark.django_db


def next_page(response) -> str | None:
    link = response.get("Link")
    if link is None:
        return None
    found = re.fullmatch(r'<(/api/v1/runs\?[^>]+)>; rel="next"', link)
    assert found, link
    return found.group(1)


def pages(api, key, url: str) -> list[list[dict]]:
    out = []
    while url is not None:
        response = api.get(url, key)
        assert response.status_code == 200, response.content
        out.append(response.json())
        url = next_page(response)
    return out


def test_the_cursor_pages_through_every_run_once_in_order(api, tenant, other_tenant, make_key):
    # 250 runs, many started at the same instant (the cursor must not lose those at a page's edge).
    events = [
        {
            "type": "run_started",
            "run_id": f"r{n:03d}",
            "ts": f"2026-11-29T10:{n // 10:02d}:00Z",
            "backend": "openai" if n % 3 else "anthropic",
        }
        for n in range(250)
    ]
    events_ingest(tenant=tenant, events=events, max_event_bytes=1 << 20)
    events_ingest(tenant=other_tenant, events=events[:5], max_event_bytes=1 << 20)
    key = make_key(tenant, ["read"])

    got = pages(api, key, "/api/v1/runs?limit=7")
    assert [len(page) for page in got] == [7] * 35 + [5]
    ids = [run["run_id"] for page in got for run in page]
    expected = list(
        Run.objects.filter(tenant=tenant).order_by("-started_at", "-pk").values_list("run_id", flat=True)
    )
    assert ids == expected and len(set(ids)) == 250

    # The filters and the limit carry over to the next pages.
    anthropic = [
        run["run_id"] for page in pages(api, key, "/api/v1/runs?backend=anthropic&limit=10") for run in page
    ]
    assert sorted(anthropic) == sorted(f"r{n:03d}" for n in range(0, 250, 3))
    # One page when everything fits: no Link.
    response = api.get("/api/v1/runs?limit=1000", key)
    assert len(response.json()) == 250 and "Link" not in response


@pytest.mark.parametrize("cursor", ["nonsense", "W10", "WyJ4IiwgMV0", "bnVsbA"])
def test_a_cursor_that_this_api_did_not_give_is_a_400(api, tenant, make_key, cursor):
    response = api.get(f"/api/v1/runs?cursor={cursor}", make_key(tenant, ["read"]))
    assert response.status_code == 400
    assert response.json()["field"] == "cursor"


def test_the_openapi_document_has_the_cursor_and_the_link_header(client):
    doc = client.get("/api/v1/schema", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    operation = doc["paths"]["/api/v1/runs"]["get"]
    assert {"cursor", "limit"} <= {p["name"] for p in operation["parameters"]}
    assert "Link" in operation["responses"]["200"]["headers"]
