"""``fleetplane run`` says whether the embedded Ray is guarded by a token, and where it is."""

from __future__ import annotations

from controlplane.admin_surface import auth_line, token_location


def test_token_auth_on_names_where_the_token_is():
    text, ok = auth_line(True, {})
    assert ok and "~/.ray/auth_token" in text
    assert "RAY_AUTH_TOKEN variable" in auth_line(True, {"RAY_AUTH_TOKEN": "x"})[0]
    assert token_location({"RAY_AUTH_TOKEN_PATH": "/etc/ray/token"}) == "/etc/ray/token"


def test_token_auth_off_is_a_warning_that_says_what_to_do():
    text, ok = auth_line(False, {"RAY_AUTH_MODE": "disabled"})
    assert not ok and text.startswith("WARNING")
    assert "RAY_AUTH_MODE=disabled" in text and "every interface" in text
    assert "unset RAY_AUTH_MODE" in text
