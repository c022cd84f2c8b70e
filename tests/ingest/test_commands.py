from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from ingest.models import ApiKey
from ingest.services.keys import api_key_lookup

pytestmark = pytest.mark.django_db


def test_create_api_key_prints_the_key_once_and_revoke_api_key_ends_it():
    out = StringIO()
    call_command("create_api_key", "acme", "--scopes", "ingest,ledger", stdout=out, stderr=StringIO())
    raw = out.getvalue().strip()
    key = api_key_lookup(raw)
    assert key is not None and key.tenant.slug == "acme" and key.scopes == ["ingest", "ledger"]
    assert not ApiKey.objects.filter(key_hash=raw).exists()
    call_command("revoke_api_key", raw, stdout=StringIO())
    assert api_key_lookup(raw) is None


def test_create_api_key_refuses_an_unknown_scope():
    with pytest.raises(CommandError, match="--scopes"):
        call_command(
            "create_api_key", "acme", "--scopes", "ingest,admin", stdout=StringIO(), stderr=StringIO()
        )
