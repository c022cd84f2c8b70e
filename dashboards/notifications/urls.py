from django.urls import path

from dashboards.notifications import views

app_name = "notifications"
urlpatterns = [
    path("", views.index, name="index"),
    path("new/", views.rule_edit, name="new"),
    path("<int:pk>/", views.rule_edit, name="rule"),
    path("<int:pk>/test/", views.rule_test, name="test"),
    path("<int:pk>/delete/", views.rule_delete, name="delete"),
]
