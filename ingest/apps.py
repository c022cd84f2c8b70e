from django.apps import AppConfig


class IngestConfig(AppConfig):
    name = "ingest"
    verbose_name = "Ingest"

    def ready(self) -> None:
        from ingest import (
            openapi,  # noqa: F401 - registers the API key scheme with drf-spectacular
            tasks,  # noqa: F401 - registers the tasks the services queue by name
        )
