from django.urls import path

from dashboards.overview import plotlyjs, views

# Not namespaced: base.html links {% url 'overview' %}.
urlpatterns = [
    path("", views.overview, name="overview"),
    path("overview/tail/", views.tail, name="overview-tail"),
    path("plotly/<str:version>/plotly.min.js", plotlyjs.plotlyjs, name="plotlyjs"),
]
