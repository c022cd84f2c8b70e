from django.urls import path

from dashboards.runs import views

app_name = "runs"
urlpatterns = [
    path("", views.index, name="index"),
    path("<int:pk>/", views.detail, name="detail"),
]
