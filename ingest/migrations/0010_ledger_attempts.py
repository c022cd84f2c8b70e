"""The ledger's attempts and reconcilers per tenant (docs/ledger.md).

Operation: attempt_id (the client's id of the latest attempt; `attempts` is its fencing token) and
unverified (a status only a key without the ledger scope traced). Run: unverified_from_seq.
Reconciler: tenant (unique per tenant and tool, no longer per tool), grace_s, keep_fields.
"""

import django.db.models.deletion
from django.db import migrations, models


def reconcilers_of_the_only_tenant(apps, schema_editor):
    """Reconcilers had no tenant before. With one tenant they were its own and stay in use; with
    several nobody can tell whose they (and their credentials) were: they keep no tenant and are
    not used until staff set one in the admin."""
    Tenant = apps.get_model("ingest", "Tenant")
    Reconciler = apps.get_model("ingest", "Reconciler")
    tenants = list(Tenant.objects.values_list("pk", flat=True)[:2])
    if len(tenants) == 1:
        Reconciler.objects.filter(tenant__isnull=True).update(tenant_id=tenants[0])


class Migration(migrations.Migration):

    dependencies = [
        ('ingest', '0009_detection_verdicts'),
    ]

    operations = [
        migrations.AddField(
            model_name='operation',
            name='attempt_id',
            field=models.CharField(blank=True, default='', help_text="The client's id of the latest attempt (a lost claim answer is asked for again with it).", max_length=200),
        ),
        migrations.AddField(
            model_name='operation',
            name='unverified',
            field=models.BooleanField(default=False, help_text='The status comes from a trace sent with a key without the ledger scope: evidence for operators; a claim gets `reconcile`, never that result.'),
        ),
        migrations.AddField(
            model_name='reconciler',
            name='grace_s',
            field=models.FloatField(default=30.0, help_text="After an attempt's lease ran out (or it timed out), how long its request may still land downstream: a 'not done' before then is asked again later, never acted on."),
        ),
        migrations.AddField(
            model_name='reconciler',
            name='keep_fields',
            field=models.JSONField(blank=True, default=list, help_text='Dotted paths of the answer kept besides the verdict, e.g. ["id"]; the rest of the downstream\'s body is never stored or shown.'),
        ),
        migrations.AddField(
            model_name='reconciler',
            name='tenant',
            field=models.ForeignKey(help_text="Whose operations it reconciles, with that tenant's credentials.", null=True, on_delete=django.db.models.deletion.CASCADE, related_name='reconcilers', to='ingest.tenant'),
        ),
        migrations.AddField(
            model_name='run',
            name='unverified_from_seq',
            field=models.PositiveIntegerField(blank=True, help_text='The first event stored through an API key without the ledger scope: the results of traced writes from it on are evidence for operators, not ledger verdicts.', null=True),
        ),
        migrations.AlterField(
            model_name='operation',
            name='attempts',
            field=models.PositiveIntegerField(default=0, help_text="Attempts granted so far; the latest one's number is its fencing token."),
        ),
        migrations.AlterField(
            model_name='reconciler',
            name='headers_name',
            field=models.CharField(blank=True, default='', help_text="A name under this tenant's slug in LOOPWATCH_RECONCILER_HEADERS (secrets stay in settings).", max_length=100),
        ),
        migrations.AlterField(
            model_name='reconciler',
            name='tool',
            field=models.CharField(max_length=200),
        ),
        migrations.AlterField(
            model_name='reconciler',
            name='url_template',
            field=models.CharField(help_text='http(s) URL with {operation_key} and/or {external_request_id} in its path or query, e.g. https://pay.example/api/refunds/{external_request_id}. Private, loopback and link-local hosts only when LOOPWATCH_RECONCILER_ALLOWED_HOSTS names them; redirects are not followed.', max_length=1000),
        ),
        migrations.AddConstraint(
            model_name='reconciler',
            constraint=models.UniqueConstraint(fields=('tenant', 'tool'), name='reconciler_tenant_tool_uniq'),
        ),
        # Last: on PostgreSQL an ALTER TABLE after rows were updated in the same transaction fails
        # ("pending trigger events" of the deferred foreign key).
        migrations.RunPython(reconcilers_of_the_only_tenant, migrations.RunPython.noop, elidable=True),
    ]
