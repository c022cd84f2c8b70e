"""`manage.py demo_setup`: what `python3 dev.py up` needs before it serves the demo."""

from __future__ import annotations

from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from dashboards.models import Membership
from demo.downstream import REFUNDS_PATH
from ingest.downstream import url_template_problem
from ingest.models import ApiKey, Backend, ModelPrice, Reconciler
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
        "Create the demo tenant, the demo/demo staff user, list prices, an API key (written to a file) "
        "and, with --downstream-url, the demo tenant's reconciler for refunds."
    )

    def add_arguments(self, parser):
        parser.add_argument("--key-file", type=Path, required=True, help="where to write the demo API key")
        parser.add_argument("--tenant", default="demo")
        parser.add_argument(
            "--downstream-url",
            default="",
            help="the demo payment service (manage.py simulate --downstream-port): the demo tenant's "
            "create_refund writes whose outcome is unknown are asked about there",
        )

    @transaction.atomic
    def handle(self, *args, key_file: Path, tenant: str, downstream_url: str, **options):
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
        if downstream_url:
            template = downstream_url.rstrip("/") + REFUNDS_PATH + "{operation_key}"
            problem = url_template_problem(template)
            if problem:
                raise CommandError(f"--downstream-url: {problem}")
            # Answers quickly, as a demo should: a few attempts close together, then a person.
            Reconciler.objects.update_or_create(
                tenant=demo,
                tool="create_refund",
                defaults={
                    "url_template": template,
                    "field": "status",
                    "done_values": ["succeeded"],
                    "not_done_values": ["failed"],
                    "not_found_means_not_done": True,
                    "keep_fields": ["id"],
                    "timeout_s": 2.0,
                    "grace_s": 5.0,
                    "max_attempts": 3,
                    "give_up_after_min": 10,
                },
            )
        self.stdout.write(f"demo tenant {demo.slug!r}, user demo/demo, API key in {key_file}")
