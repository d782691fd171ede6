"""Keep secrets out of everything the connector shows: masked values, URLs without passwords.

:class:`Secret` wraps a configuration value whose ``repr``/``str`` never show it; :func:`redact_url`
masks the password of a URL (``state.store`` may carry one); :func:`secrets_in` lists the secret
strings among raw properties so a log masker (the CLI's formatter, Airflow's secrets masker) can
hide them wherever they would otherwise appear.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

_ENV_REF = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")


class Secret:
    """A configuration value that must never reach logs.

    :param shown: what ``repr``/``str`` show instead of the value (default ``****``), e.g. a URL
        with its password masked.
    """

    __slots__ = ("_shown", "_value")

    def __init__(self, value: str, shown: str = "****") -> None:
        self._value = value
        self._shown = shown

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret({self._shown!r})"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


def redact_url(url: str) -> str:
    """``url`` with the password of its user-info and secret-looking query values masked.

    Anything that does not parse as a URL with a network location is returned with everything
    between ``://`` and the last ``@`` masked, so a malformed URL never leaks a password either.
    """
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, host = netloc.rsplit("@", 1)
            user = userinfo.split(":", 1)[0]
            netloc = f"{user}:****@{host}" if ":" in userinfo else netloc
        query = "&".join(
            f"{k}=****" if _SECRET_KEY.search(k) else (f"{k}={v}" if v or "=" in pair else k)
            for pair in parts.query.split("&")
            if pair
            for k, _, v in [pair.partition("=")]
        )
        if netloc == parts.netloc and query == parts.query:
            return url
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        return re.sub(r"(?<=://).*@", "****@", url)


_SECRET_KEY = re.compile(r"pass|secret|token|key", re.IGNORECASE)
_SECRET_PROPERTY = re.compile(r"password|secret|token", re.IGNORECASE)
#: properties whose value is a URL that may carry a password
SECRET_URL_PROPERTIES = ("state.store",)


def secrets_in(properties: Mapping[str, Any]) -> list[str]:
    """The secret strings among raw ``properties`` (for a log masker such as Airflow's).

    Values of password-like properties, and the password (plus the whole URL) of URL properties
    such as ``state.store``.  ``${env:...}`` references are expanded first: the expanded value
    is what could reach a log.
    """
    out: list[str] = []
    for key, value in properties.items():
        text = value.reveal() if isinstance(value, Secret) else value
        if not isinstance(text, str) or not text:
            continue
        text = _ENV_REF.sub(lambda m: os.environ.get(m.group(1), ""), text)
        if key in SECRET_URL_PROPERTIES:
            try:
                password = urlsplit(text).password
            except ValueError:
                password = None
            if password:
                out += [password, text]
        elif _SECRET_PROPERTY.search(str(key)):
            out.append(text)
    return out
