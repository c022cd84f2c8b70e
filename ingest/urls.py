from django.urls import path, register_converter

from ingest.api.events import EventsIngestApi
from ingest.api.guard import RunCheckApi, RunHandoffAnswerApi
from ingest.api.incidents import IncidentListApi, RunDetectionsApi
from ingest.api.operations import (
    OperationClaimApi,
    OperationCompleteApi,
    OperationDetailApi,
    OperationReleaseApi,
    OperationRenewApi,
)
from ingest.api.runs import RunDetailApi, RunEventsApi, RunListApi


class StoredTextConverter:
    """A path segment (slashes allowed) that a stored id can be: no U+0000, which PostgreSQL's text
    cannot hold (looking one up raised instead of finding nothing). Such a path is a 404."""

    regex = "[^\x00]+"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(StoredTextConverter, "stored")

urlpatterns = [
    path("events", EventsIngestApi.as_view(), name="api-events"),
    path("runs", RunListApi.as_view(), name="api-runs"),
    path("runs/<stored:run_id>/events", RunEventsApi.as_view(), name="api-run-events"),
    path("runs/<stored:run_id>/detections", RunDetectionsApi.as_view(), name="api-run-detections"),
    path("runs/<stored:run_id>/check", RunCheckApi.as_view(), name="api-run-check"),
    path("runs/<stored:run_id>/handoff", RunHandoffAnswerApi.as_view(), name="api-run-handoff"),
    path("runs/<stored:run_id>", RunDetailApi.as_view(), name="api-run"),
    path("incidents", IncidentListApi.as_view(), name="api-incidents"),
    path("operations/claim", OperationClaimApi.as_view(), name="api-operation-claim"),
    path("operations/<stored:key>/complete", OperationCompleteApi.as_view(), name="api-operation-complete"),
    path("operations/<stored:key>/renew", OperationRenewApi.as_view(), name="api-operation-renew"),
    path("operations/<stored:key>/release", OperationReleaseApi.as_view(), name="api-operation-release"),
    path("operations/<stored:key>", OperationDetailApi.as_view(), name="api-operation"),
]
