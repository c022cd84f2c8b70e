from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from dashboards.models import Membership
from ingest.models import ApiKey, Backend, ModelPrice
from ingest.services import api_key_create, api_key_hash, tenant_get_or_create

# Public list prices in USD per million tokens (input, output) at the time of writing; edit them in the admin.
DEMO_PRICES = {
    ("openai", "1.0"): {"gpt-4o": (2.5, 10.0), "gpt-4o-mini": (0.15, 0.6)},
    ("anthropic", "1.0"): {"claude-sonnet-4": (3.0, 15.0)},
    # bought through an aggregator that bills the official price x 1.3
    ("deepseek", "1.3"): {"deepseek-chat": (0.27, 1.10)},
    ("local", "1.0"): {"": (0.0, 0.0)},
}


class Command(BaseCommand):
    help = (
        "Create the demo tenant, the demo/demo staff user, list prices, and an API key (written to a file)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--key-file", type=Path, required=True, help="where to write the demo API key")
        parser.add_argument("--tenant", default="demo")

    @transaction.atomic
    def handle(self, *args, key_file: Path, tenant: str, **options):
        demo = tenant_get_or_create(slug=tenant, name="Demo")
        user_model = get_user_model()
        user, created = user_model.objects.get_or_create(username="demo", defaults={"is_staff": True})
        if created:
            user.is_superuser = True
            user.set_password("demo")
            user.save()
        Membership.objects.get_or_create(user=user, tenant=demo, defaults={"role": Membership.Role.ADMIN})
        for (backend_name, markup), models in DEMO_PRICES.items():
            backend, _ = Backend.objects.get_or_create(name=backend_name, defaults={"markup": markup})
            for model, (pin, pout) in models.items():
                ModelPrice.objects.get_or_create(
                    backend=backend,
                    model=model,
                    defaults={"input_usd_per_mtok": pin, "output_usd_per_mtok": pout},
                )
        existing = key_file.read_text().strip() if key_file.exists() else ""
        if not ApiKey.objects.filter(key_hash=api_key_hash(existing), revoked_at=None).exists():
            _, raw = api_key_create(tenant=demo, scopes=["ingest", "read", "ledger"], name="demo")
            key_file.parent.mkdir(parents=True, exist_ok=True)
            key_file.write_text(raw + "\n")
            key_file.chmod(0o600)
        self.stdout.write(f"demo tenant {demo.slug!r}, user demo/demo, API key in {key_file}")
