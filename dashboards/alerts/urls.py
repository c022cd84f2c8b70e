from django.urls import path

from dashboards.alerts import views

app_name = "alerts"
urlpatterns = [
    path("", views.index, name="index"),
    path("<int:pk>/feedback/", views.feedback, name="feedback"),
    path("incidents/<int:pk>/", views.incident, name="incident"),
    path("incidents/<int:pk>/verdict/", views.verdict, name="verdict"),
]
