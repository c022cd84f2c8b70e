"""Steps the browser tests share."""

from __future__ import annotations

from django.contrib.auth import get_user_model

from dashboards.models import Membership


def member(tenant, username: str, role: str = "operator", password: str = "pw-browser-1"):
    """A user of the tenant with the role; returns (user, password)."""
    user = get_user_model().objects.create_user(username, password=password)
    Membership.objects.create(user=user, tenant=tenant, role=role)
    return user, password


def sign_in(page, live_stack, username: str, password: str, next_path: str = "/") -> None:
    page.goto(f"{live_stack.url}/accounts/login/?next={next_path}")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    with page.expect_navigation():
        page.click("button[type=submit]")
    if "/accounts/login/" in page.url:
        raise AssertionError(f"sign-in as {username} failed: still on {page.url}")
