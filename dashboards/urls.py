from django.urls import include, path

from dashboards import views

urlpatterns = [
    path("", views.overview, name="overview"),
    path("alerts/", include("dashboards.alerts.urls")),
    path("runs/", include("dashboards.runs.urls")),
    path("queue/", include("dashboards.queue.urls")),
    path("thresholds/", include("dashboards.thresholds.urls")),
]
