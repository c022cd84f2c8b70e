from django.core.management.base import BaseCommand, CommandError

from ingest.models import ApiKey
from ingest.services import api_key_create, tenant_get_or_create


class Command(BaseCommand):
    help = "Create an API key for TENANT (created if new) and print it once; only its hash is kept."

    def add_arguments(self, parser):
        parser.add_argument("tenant", help="tenant slug")
        parser.add_argument(
            "--scopes",
            default="ingest,read",
            help=f"comma-separated, from {', '.join(ApiKey.Scope.values)} (default: ingest,read)",
        )
        parser.add_argument("--name", default="", help="a label to tell keys apart")

    def handle(self, *args, tenant, scopes, name, **options):
        scope_list = [s.strip() for s in scopes.split(",") if s.strip()]
        try:
            tenant_obj = tenant_get_or_create(slug=tenant)
            key, raw = api_key_create(tenant=tenant_obj, scopes=scope_list, name=name)
        except ValueError as exc:
            raise CommandError(f"--scopes: {exc}") from None
        self.stderr.write(f"key {key.prefix}… for tenant {tenant_obj.slug}, scopes {','.join(key.scopes)}")
        self.stdout.write(raw)
