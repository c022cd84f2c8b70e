from django.urls import include, path

urlpatterns = [
    path("", include("dashboards.overview.urls")),
    path("alerts/", include("dashboards.alerts.urls")),
    path("runs/", include("dashboards.runs.urls")),
    path("queue/", include("dashboards.queue.urls")),
    path("thresholds/", include("dashboards.thresholds.urls")),
    path("notifications/", include("dashboards.notifications.urls")),
]
