"""Who may see the dashboard, and which POSTs it takes.

Authentication: with a password, every page needs it, given either as HTTP
Basic credentials (any user name; for scripts and ``curl -u :PASSWORD``) or
through the login form, which sets a signed session cookie.  Without a
password the dashboard is open, which ``pgfence web`` allows on a loopback
address only.

CSRF: a signed double-submit cookie.  Every visitor gets a random nonce in
the cookie ``pgfence_csrf``; each form carries ``HMAC(secret, nonce)`` as
its ``csrf_token``.  Another site can make a browser send the cookie, but it
can neither read it nor compute its HMAC, so it cannot forge the form field.
Every comparison is constant-time.

The secret is random per process unless given: an application that runs
the dashboard in several processes passes the same secret to each.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import secrets
import time

CSRF_COOKIE = "pgfence_csrf"
SESSION_COOKIE = "pgfence_session"
FLASH_COOKIE = "pgfence_flash"
#: How long a login lasts.
SESSION_SECONDS = 12 * 3600


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (or ``localhost``): only then
    may the dashboard run without a password.  A host name other than
    localhost counts as not loopback (it may resolve anywhere)."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Signer:
    """HMAC-SHA256 signatures of short texts, each for one purpose."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._key = secret if secret is not None else secrets.token_bytes(32)

    def sign(self, purpose: str, value: str) -> str:
        mac = hmac.new(self._key, f"{purpose}\0{value}".encode(), hashlib.sha256)
        return mac.hexdigest()

    def valid(self, purpose: str, value: str, signature: str) -> bool:
        return hmac.compare_digest(self.sign(purpose, value).encode(), signature.encode())

    # -- CSRF ------------------------------------------------------------------------

    @staticmethod
    def new_nonce() -> str:
        return secrets.token_urlsafe(18)

    def csrf_token(self, nonce: str) -> str:
        return self.sign("csrf", nonce)

    def csrf_valid(self, nonce: str | None, token: object) -> bool:
        """Whether the form's ``token`` is the one of the cookie's ``nonce``."""
        if not nonce or not isinstance(token, str) or not token:
            return False
        return self.valid("csrf", nonce, token)

    # -- the login session ---------------------------------------------------------

    def session_cookie(self, now: float | None = None) -> str:
        expires = str(int((time.time() if now is None else now) + SESSION_SECONDS))
        return f"{expires}.{self.sign('session', expires)}"

    def session_valid(self, cookie: str | None, now: float | None = None) -> bool:
        if not cookie or "." not in cookie:
            return False
        expires, signature = cookie.split(".", 1)
        if not self.valid("session", expires, signature):
            return False
        return expires.isdigit() and int(expires) > (time.time() if now is None else now)

    # -- the message shown once after an action --------------------------------------

    def flash_cookie(self, message: str) -> str:
        text = base64.urlsafe_b64encode(message.encode()).decode()
        return f"{text}.{self.sign('flash', text)}"

    def flash_message(self, cookie: str | None) -> str | None:
        if not cookie or "." not in cookie:
            return None
        text, signature = cookie.split(".", 1)
        if not self.valid("flash", text, signature):
            return None
        try:
            return base64.urlsafe_b64decode(text.encode()).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None


def password_matches(password: str, given: str) -> bool:
    """Constant-time comparison of the password with what was given."""
    return hmac.compare_digest(password.encode(), given.encode())


def basic_credentials(header: str | None) -> tuple[str, str] | None:
    """The user name and password of an ``Authorization: Basic`` header,
    or None when the header is absent or not Basic."""
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else None


def basic_password(header: str | None) -> str | None:
    """The password of an ``Authorization: Basic`` header (any user name),
    or None when the header is absent or not Basic."""
    credentials = basic_credentials(header)
    return credentials[1] if credentials else None


#: Who acts when nothing names the operator (as pauses are recorded).
DASHBOARD_IDENTITY = "pgfence web"


def operator(user: object, authorization: str | None, client: str | None) -> str:
    """Who acts, as the audit of bulk actions records it: the user that an
    application mounting the dashboard authenticated (Starlette's
    ``request.user``, given as ``user``), else the user name sent with
    HTTP Basic, else ``pgfence web``; then the client's address."""
    name = None
    if getattr(user, "is_authenticated", False):
        name = str(getattr(user, "display_name", "") or "") or None
    if name is None:
        credentials = basic_credentials(authorization)
        name = credentials[0] if credentials and credentials[0] else None
    who = (name or DASHBOARD_IDENTITY)[:200]
    return f"{who} from {client}" if client else who
