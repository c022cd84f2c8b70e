from django.core.management.base import BaseCommand, CommandError

from ingest.models import ApiKey
from ingest.services import api_key_hash, api_key_revoke


class Command(BaseCommand):
    help = "Revoke an API key, given the key itself or its prefix (as listed in the admin)."

    def add_arguments(self, parser):
        parser.add_argument("key", help="the raw key, or its prefix")

    def handle(self, *args, key, **options):
        found = list(ApiKey.objects.filter(key_hash=api_key_hash(key))) or list(
            ApiKey.objects.filter(prefix=key[:10])
        )
        if len(found) != 1:
            raise CommandError(f"key: {'no' if not found else 'more than one'} key matches {key[:10]!r}")
        api_key_revoke(key=found[0])
        self.stdout.write(f"revoked {found[0].prefix}… of tenant {found[0].tenant.slug}")
