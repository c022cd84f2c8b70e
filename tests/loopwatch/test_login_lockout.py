"""Signing in is rate limited (django-axes): too many wrong passwords for one user from one address
lock that pair out for a while, the right password included; other users and addresses are not
locked with it."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

pytestmark = pytest.mark.django_db

LOGIN = "/accounts/login/"


@pytest.fixture
def users():
    model = get_user_model()
    return model.objects.create_user("ana", password="right-pw-1"), model.objects.create_user(
        "bob", password="bob-pw-1"
    )


def _sign_in(client: Client, username: str, password: str, address: str = "203.0.113.7"):
    return client.post(LOGIN, {"username": username, "password": password}, REMOTE_ADDR=address)


def test_thirty_wrong_passwords_then_the_right_one_is_locked_out(users, settings):
    client = Client()
    for n in range(30):
        answer = _sign_in(client, "ana", f"wrong-{n}")
        assert answer.status_code in (200, 429)  # the form again, then the lockout page
    locked = _sign_in(client, "ana", "right-pw-1")
    assert locked.status_code == 429
    assert "_auth_user_id" not in client.session  # not signed in
    page = locked.content.decode()
    assert "Too many failed sign-ins" in page and "Try again in 15 minutes" in page
    # another user from the same address, and the same user from another address, are not locked
    assert _sign_in(Client(), "bob", "bob-pw-1").status_code == 302
    assert _sign_in(Client(), "ana", "right-pw-1", address="198.51.100.9").status_code == 302


def test_the_lockout_ends_after_the_cool_off(users, settings):
    client = Client()
    for n in range(settings.AXES_FAILURE_LIMIT):
        _sign_in(client, "ana", f"wrong-{n}")
    assert _sign_in(client, "ana", "right-pw-1").status_code == 429
    with time_machine.travel(timezone.now() + settings.AXES_COOLOFF_TIME + timedelta(seconds=1)):
        assert _sign_in(client, "ana", "right-pw-1").status_code == 302


def test_the_admin_sign_in_is_limited_as_well(users, settings):
    model = get_user_model()
    model.objects.create_superuser("root", password="root-pw-1")
    client = Client()
    for n in range(settings.AXES_FAILURE_LIMIT):
        client.post(
            "/admin/login/", {"username": "root", "password": f"wrong-{n}"}, REMOTE_ADDR="203.0.113.7"
        )
    answer = client.post(
        "/admin/login/", {"username": "root", "password": "root-pw-1"}, REMOTE_ADDR="203.0.113.7"
    )
    assert answer.status_code == 429
