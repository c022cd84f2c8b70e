from django.urls import path

from dashboards.thresholds import views

app_name = "thresholds"
urlpatterns = [
    path("", views.index, name="index"),
    path("<slug:slug>/", views.tenant_index, name="tenant"),
    path("<slug:slug>/sets/new/", views.threshold_edit, name="set_new"),
    path("<slug:slug>/sets/<int:pk>/", views.threshold_edit, name="set_edit"),
    path("<slug:slug>/tools/new/", views.tool_edit, name="tool_new"),
    path("<slug:slug>/tools/<int:pk>/", views.tool_edit, name="tool_edit"),
    path("<slug:slug>/history/", views.history, name="history"),
]
