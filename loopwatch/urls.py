from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from ingest.api.otlp import OtlpTracesIngestApi
from ingest.views import metrics_view
from loopwatch.views import favicon

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/v1/", include("ingest.urls")),
    path("api/v1/schema", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/v1/docs", SpectacularSwaggerSplitView.as_view(url_name="api-schema"), name="api-docs"),
    path("favicon.ico", favicon, name="favicon"),
    # OTLP/HTTP's own path: an exporter given OTEL_EXPORTER_OTLP_ENDPOINT=https://host appends it.
    path("v1/traces", OtlpTracesIngestApi.as_view(), name="otlp-traces"),
    path("metrics", metrics_view, name="metrics"),
    path("", include("dashboards.urls")),
]

handler400 = "ingest.api.errors.bad_request"
handler404 = "ingest.api.errors.not_found"
handler500 = "ingest.api.errors.server_error"
