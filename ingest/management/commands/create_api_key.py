from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from ingest.models import ApiKey, Tenant
from ingest.services import api_key_create, tenant_get_or_create


def who_sees(tenant: Tenant) -> str:
    """Who sees the tenant's traces on the pages: its members (memberships, kept by the dashboards
    app and read here through the reverse relation, without importing it) and every superuser."""
    members = [
        f"{username} ({role})"
        for username, role in tenant.memberships.order_by("user__username").values_list(
            "user__username", "role"
        )
    ]
    supers = list(
        get_user_model()
        .objects.filter(is_superuser=True, is_active=True)
        .order_by("username")
        .values_list("username", flat=True)
    )
    seen = []
    if members:
        seen.append("members " + ", ".join(members))
    if supers:
        seen.append("superusers " + ", ".join(supers))
    if not seen:
        return (
            f"nobody can see {tenant.slug}'s traces on the pages yet: "
            f"`manage.py add_member USER {tenant.slug} --role admin` (or `manage.py createsuperuser`)"
        )
    return (
        f"who sees {tenant.slug}'s traces: {'; '.join(seen)}. "
        f"Add someone: `manage.py add_member USER {tenant.slug} --role viewer|operator|admin`"
    )


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
        existed = Tenant.objects.filter(slug=tenant).exists()
        try:
            tenant_obj = tenant_get_or_create(slug=tenant)
            key, raw = api_key_create(tenant=tenant_obj, scopes=scope_list, name=name)
        except ValueError as exc:
            raise CommandError(f"--scopes: {exc}") from None
        # The key alone on stdout (scripts capture it); what it is and who sees its data on stderr.
        made = "the existing tenant" if existed else "a new tenant"
        self.stderr.write(f"key {key.prefix}… for {made} {tenant_obj.slug}, scopes {','.join(key.scopes)}")
        self.stderr.write(who_sees(tenant_obj))
        self.stdout.write(raw)
