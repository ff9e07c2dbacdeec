"""What to do about a failed export attempt, told by its cause where the error says it.

The OTLP exporters report a failed attempt in one line of text: Python's `ssl` words for
OTLP/HTTP (`[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed
certificate`), gRPC's core for gRPC (`Tls handshake failed (TSI_PROTOCOL_FAILURE): …
CERTIFICATE_VERIFY_FAILED: self signed certificate`, `Hostname Verification Check failed`).
A TLS failure means a receiver is there and answered: "start a receiver" would send the user the
wrong way. Unknown text gives None, and the caller keeps its general advice.
"""

from __future__ import annotations

import re

_CA = ("OTEL_EXPORTER_OTLP_CERTIFICATE=<the CA's PEM file> (or OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE; "
       "in the Helm chart, otlp.tls.secretName)")

#: (what the error text says, what to do), first match wins: the specific certificate causes
#: before the general verification failure.
_CAUSES = (
    (re.compile(r"hostname mismatch|ip address mismatch|not valid for '|hostname verification check failed|"
                r"peer name .* is not in peer certificate", re.I),
     "the receiver's certificate is not issued for the host name in the endpoint: use a name its "
     "subjectAltName lists in --otlp-endpoint, or have the certificate issued for this one"),
    (re.compile(r"certificate has expired|certificate is not yet valid|CERTIFICATE_EXPIRED", re.I),
     "the receiver's certificate has expired or is not yet valid: renew it (or correct this machine's clock)"),
    (re.compile(r"self[- ]signed certificate|unable to get (local )?issuer certificate|unknown ca|"
                r"CERTIFICATE_VERIFY_FAILED|certificate verify failed", re.I),
     "TLS: the receiver's certificate is not signed by a CA this machine trusts; trust that CA: " + _CA),
    (re.compile(r"certificate required|CERTIFICATE_REQUIRED", re.I),
     "TLS: the receiver asks for a client certificate: OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and "
     "OTEL_EXPORTER_OTLP_CLIENT_KEY (PEM files)"),
    (re.compile(r"WRONG_VERSION_NUMBER|wrong version number|packet length too long", re.I),
     "the receiver speaks plain text, not TLS: use http:// in --otlp-endpoint"),
)


def export_fix(error: str) -> str | None:
    """The fix for the cause `error` names, or None when it names none this module knows."""
    for pattern, fix in _CAUSES:
        if pattern.search(error):
            return fix
    return None
