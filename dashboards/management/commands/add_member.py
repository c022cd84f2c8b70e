"""manage.py add_member USER TENANT --role viewer|operator|admin: give a user a tenant's pages."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from dashboards.models import Membership
from ingest.models import Tenant


class Command(BaseCommand):
    help = (
        "Make USER a member of TENANT with a role (viewer reads; operator also marks alerts, answers "
        "runs and decides writes; admin also changes thresholds). An existing membership changes role."
    )

    def add_arguments(self, parser):
        parser.add_argument("user", help="username")
        parser.add_argument("tenant", help="tenant slug (create_api_key TENANT makes a tenant)")
        parser.add_argument("--role", choices=Membership.Role.values, default=Membership.Role.VIEWER)

    def handle(self, *args, user, tenant, role, **options):
        found_user = get_user_model().objects.filter(username=user).first()
        if found_user is None:
            raise CommandError(
                f"user: no user {user!r} (manage.py createsuperuser, or the admin's Users page)"
            )
        found_tenant = Tenant.objects.filter(slug=tenant).first()
        if found_tenant is None:
            known = (
                ", ".join(Tenant.objects.order_by("slug").values_list("slug", flat=True)[:20]) or "none yet"
            )
            raise CommandError(
                f"tenant: no tenant {tenant!r} (tenants: {known}); `manage.py create_api_key {tenant}` makes it"
            )
        membership, created = Membership.objects.get_or_create(
            user=found_user, tenant=found_tenant, defaults={"role": role}
        )
        if created:
            self.stdout.write(f"{user} is now {role} of {tenant}.")
        elif membership.role != role:
            before = membership.role
            membership.role = role
            membership.save(update_fields=["role"])
            self.stdout.write(f"{user} was {before} of {tenant}, now {role}.")
        else:
            self.stdout.write(f"{user} already is {role} of {tenant}: nothing changed.")
