"""Credentials an operator gives the exporter never printed: the endpoint URL's user and
password (`http://user:pass@host`), secret-looking query values, and the OTLP header values
(`OTEL_EXPORTER_OTLP_[TRACES_]HEADERS`, e.g. `authorization=Bearer …`).

An HTTP client turns the URL's user:password into `Authorization: Basic <base64>`, which a
proxy's error may quote: that form is a secret too.

`redact_url` is for the places that name the endpoint (start line, /readyz, --print-config, the
replay report); `Redactor` scrubs every log line as the last step before it is written, so an
exporter's or a library's error message that quotes a URL or a header is scrubbed too.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Mapping
from urllib.parse import unquote

MASK = "***"
# scheme://userinfo@ — userinfo is anything up to the `@` that ends the authority
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/?#@\s'\"]+@")
_SECRET_QUERY = re.compile(r"(?i)([?&](?:[\w.-]*(?:key|token|secret|password|passwd|pwd|auth|signature|sig)"
                           r"[\w.-]*)=)[^&#\s'\"]+")
HEADER_VARIABLES = ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS")


def redact_url(url: str | None) -> str | None:
    """The URL with its user:password and secret-looking query values replaced by ***."""
    if not url:
        return url
    return _SECRET_QUERY.sub(r"\1" + MASK, _USERINFO.sub(r"\1" + MASK + "@", url))


def secrets_from(env: Mapping[str, str], endpoint: str | None = None) -> tuple[str, ...]:
    """The exact strings that must not appear in output: the header values (as given and
    URL-decoded, the spec allows percent-encoding) and the endpoint's userinfo."""
    found: set[str] = set()
    for var in HEADER_VARIABLES:
        for item in (env.get(var) or "").split(","):
            _, eq, value = item.partition("=")
            value = value.strip()
            if eq and value:
                found.update({value, unquote(value)})
                # `Bearer <token>`, `Basic <b64>`: the token alone may be quoted too
                scheme, _, rest = unquote(value).partition(" ")
                if rest.strip():
                    found.add(rest.strip())
    if endpoint:
        m = _USERINFO.search(endpoint)
        if m:
            info = endpoint[m.end(1):m.end() - 1]
            found.update({info, unquote(info)})
            # what an HTTP client makes of it: `Authorization: Basic base64(user:password)`
            found.add(base64.b64encode(unquote(info).encode()).decode())
            _, colon, password = info.partition(":")
            if colon and password:
                found.update({password, unquote(password)})
    return tuple(sorted((s for s in found if len(s) >= 4), key=len, reverse=True))  # longest first


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    for s in secrets:
        if s in text:
            text = text.replace(s, MASK)
    return redact_url(text) if "://" in text or "=" in text else text


class Redactor:
    """A structlog processor: every string in the event (nested lists and dicts too) scrubbed."""

    __slots__ = ("secrets",)

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self.secrets = tuple(secrets)

    def __call__(self, _logger, _method, event: dict) -> dict:
        return {k: self._clean(v) for k, v in event.items()}

    def _clean(self, v):
        if isinstance(v, str):
            return redact_text(v, self.secrets)
        if isinstance(v, (list, tuple)):
            return type(v)(self._clean(x) for x in v)
        if isinstance(v, dict):
            return {k: self._clean(x) for k, x in v.items()}
        return v
