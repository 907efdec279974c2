"""Secrets never reach a tracking sink: config keys that name a secret, credentials inside URLs, and the values
of secret-looking environment variables are replaced before anything is logged."""

from __future__ import annotations

import re
from collections.abc import Mapping

REDACTED = "<redacted>"
# Names of keys and environment variables that hold secrets (api_key, HF_TOKEN, WANDB_API_KEY, db_password, ...).
SECRET_NAME = re.compile(r"(api[_-]?key|access[_-]?key|token|secret|passw(or)?d|credential|private[_-]?key|bearer)", re.I)
# user:password@ in URLs such as https://user:pw@host or ray://user:pw@host.
URL_PASSWORD = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<pw>[^@/\s]+)@", re.I)
MIN_SECRET_LEN = 8  # shorter values ("1", "true") would redact ordinary config values by coincidence


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME.search(str(name)))


def secret_env_values(environ: Mapping[str, str]) -> list[str]:
    """Values of environment variables whose names look like secrets, longest first."""
    vals = {v for k, v in environ.items() if is_secret_name(k) and len(v) >= MIN_SECRET_LEN}
    return sorted(vals, key=len, reverse=True)


def redact_text(text: str, secret_values: tuple[str, ...] | list[str] = ()) -> str:
    text = URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:{REDACTED}@", text)
    for v in secret_values:
        text = text.replace(v, REDACTED)
    return text


def redact(obj, secret_values: tuple[str, ...] | list[str] = ()):
    """A copy of a nested dict/list config with secret keys' values, URL passwords and known secret values
    replaced by '<redacted>'."""
    if isinstance(obj, Mapping):
        return {k: (REDACTED if is_secret_name(k) and v not in (None, "") else redact(v, secret_values))
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact(v, secret_values) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj, secret_values)
    return obj

