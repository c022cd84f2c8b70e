from django.urls import path

from dashboards.thresholds import views

app_name = "thresholds"
urlpatterns = [path("", views.index, name="index")]
