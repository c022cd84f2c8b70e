from django.urls import path

from ingest.api.events import EventsIngestApi
from ingest.api.guard import RunCheckApi, RunHandoffAnswerApi
from ingest.api.operations import (
    OperationClaimApi,
    OperationCompleteApi,
    OperationDetailApi,
    OperationReleaseApi,
    OperationRenewApi,
)
from ingest.api.runs import RunDetailApi, RunEventsApi, RunListApi

urlpatterns = [
    path("events", EventsIngestApi.as_view(), name="api-events"),
    path("runs", RunListApi.as_view(), name="api-runs"),
    path("runs/<path:run_id>/events", RunEventsApi.as_view(), name="api-run-events"),
    path("runs/<path:run_id>/check", RunCheckApi.as_view(), name="api-run-check"),
    path("runs/<path:run_id>/handoff", RunHandoffAnswerApi.as_view(), name="api-run-handoff"),
    path("runs/<path:run_id>", RunDetailApi.as_view(), name="api-run"),
    path("operations/claim", OperationClaimApi.as_view(), name="api-operation-claim"),
    path("operations/<path:key>/complete", OperationCompleteApi.as_view(), name="api-operation-complete"),
    path("operations/<path:key>/renew", OperationRenewApi.as_view(), name="api-operation-renew"),
    path("operations/<path:key>/release", OperationReleaseApi.as_view(), name="api-operation-release"),
    path("operations/<path:key>", OperationDetailApi.as_view(), name="api-operation"),
]
