from django.urls import path

from dashboards.queue import views

app_name = "queue"
urlpatterns = [
    path("", views.index, name="index"),
    path("<int:pk>/", views.detail, name="detail"),
]
