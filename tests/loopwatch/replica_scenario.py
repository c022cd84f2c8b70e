"""Run by tests/loopwatch/test_replica.py in a process of its own, with DATABASE_URL naming a private
primary and DATABASE_REPLICA_URL its streaming replica: what the pages and the API show while the
replica's replay is paused. Prints one JSON object: per step, whether each run's id was on the page.
"""

from __future__ import annotations

import json
import os
import time

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django.setup()

import psycopg  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.test import Client  # noqa: E402

from dashboards.models import Membership  # noqa: E402
from ingest.models import Detection  # noqa: E402
from ingest.services import api_key_create, tenant_get_or_create  # noqa: E402
from tests.ingest.events import model_round, run_started, tool_call, tool_result, with_ids  # noqa: E402

BEFORE, AFTER = "run-alpha-7", "run-bravo-7"  # stored before the pause, and during it


def _loop(run_id: str) -> list[dict]:
    events = [run_started(run_id)]
    for i in range(1, 5):
        events += [
            model_round(run_id, n=i),
            tool_call(run_id, f"c{i}", n=i),
            tool_result(run_id, f"c{i}", n=i),
        ]
    return with_ids(events)


def main() -> None:
    primary = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)
    replica = psycopg.connect(os.environ["DATABASE_REPLICA_URL"], autocommit=True)

    def caught_up() -> None:
        (lsn,) = primary.execute("SELECT pg_current_wal_lsn()").fetchone()
        deadline = time.monotonic() + 30
        while not replica.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [lsn]).fetchone()[0]:
            assert time.monotonic() < deadline, "the replica did not catch up in 30 s"
            time.sleep(0.05)

    tenant = tenant_get_or_create(slug="demo")
    user = get_user_model().objects.create_user("ann", password="not-a-secret-1")
    Membership.objects.create(user=user, tenant=tenant, role=Membership.Role.OPERATOR)
    _, key = api_key_create(tenant=tenant, scopes=["ingest", "read"])
    auth = {"HTTP_AUTHORIZATION": f"Bearer {key}"}
    api = Client()

    def send(run_id: str) -> None:
        answer = api.post(
            "/api/v1/events", json.dumps(_loop(run_id)), content_type="application/json", **auth
        )
        assert answer.status_code == 200, answer.content

    def shown(client: Client, path: str, **extra) -> dict[str, bool]:
        answer = client.get(path, **extra)
        assert answer.status_code == 200, (path, answer.status_code)
        text = answer.content.decode()
        return {BEFORE: BEFORE in text, AFTER: AFTER in text}

    seen: dict[str, dict] = {}
    send(BEFORE)
    caught_up()
    replica.execute("SELECT pg_wal_replay_pause()")
    send(AFTER)  # on the primary only, while the replica's replay is paused
    ann = Client()
    ann.force_login(user)  # the session is written to the primary and read from it
    seen["runs page, replica paused"] = shown(ann, "/runs/")
    seen["API, replica paused"] = shown(api, "/api/v1/runs", **auth)
    detection = Detection.objects.filter(run__run_id=BEFORE).exclude(action="observe").first()
    answer = ann.post(f"/alerts/{detection.pk}/feedback/", {"verdict": "true_loop"})
    seen["verdict"] = {
        "status": answer.status_code,
        "stored": Detection.objects.get(pk=detection.pk).feedback,
    }
    seen["runs page after a write"] = shown(ann, "/runs/")
    other = Client()
    other.force_login(user)
    seen["runs page, another browser"] = shown(other, "/runs/")
    replica.execute("SELECT pg_wal_replay_resume()")
    caught_up()
    seen["runs page, replica resumed"] = shown(other, "/runs/")
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
