"""The one error of the certificate program: something the user must fix."""

from __future__ import annotations


class CertError(Exception):
    """Something the user must fix (an option, existing files, the CA); the message says what."""
