"""A token in the usual HTTP place: ``Authorization: Bearer hnt1:...`` (pure parsing)."""

from __future__ import annotations

import pytest

from hearthnet.tokens import TOKEN_PREFIX
from hearthnet.transport.headers import bearer_token, read_signed_headers


@pytest.mark.parametrize(
    ("authorization", "token"),
    [
        ("Bearer hnt1:abc", "hnt1:abc"),
        ("bearer   hnt1:abc  ", "hnt1:abc"),
        ("BEARER hnt1:abc", "hnt1:abc"),
        ("Basic dXNlcjpwYXNz", None),  # a proxy's own credentials are left alone
        ("Bearer eyJhbGciOiJIUzI1NiJ9.e30.x", None),
        ("Bearer", None),
        ("hnt1:abc", None),
        ("", None),
        (None, None),
    ],
)
def test_bearer_token(authorization: str | None, token: str | None) -> None:
    assert bearer_token(authorization) == token


def test_x_hearthnet_token_then_authorization_then_the_query() -> None:
    both = {"x-hearthnet-token": "hnt1:x", "authorization": "Bearer hnt1:a"}
    assert read_signed_headers(both, query_token="hnt1:q").token == "hnt1:x"
    assert read_signed_headers({"authorization": "Bearer hnt1:a"}, query_token="hnt1:q").token == (
        "hnt1:a"
    )
    assert read_signed_headers({}, query_token="hnt1:q").token == "hnt1:q"


def test_the_prefix_taken_from_authorization_is_the_tokens_own() -> None:
    assert bearer_token(f"Bearer {TOKEN_PREFIX}z") == f"{TOKEN_PREFIX}z"
