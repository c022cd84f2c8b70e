from django.urls import path

from ingest.api.events import EventsIngestApi
from ingest.api.runs import RunDetailApi, RunEventsApi, RunListApi

urlpatterns = [
    path("events", EventsIngestApi.as_view(), name="api-events"),
    path("runs", RunListApi.as_view(), name="api-runs"),
    path("runs/<path:run_id>/events", RunEventsApi.as_view(), name="api-run-events"),
    path("runs/<path:run_id>", RunDetailApi.as_view(), name="api-run"),
]
