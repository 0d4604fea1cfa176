"""A checkpoint URL resolved to a filesystem and a path, and the redaction of its secrets (G9).

Credentials and endpoints come from where the fsspec backend looks for them (for s3fs:
``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, AWS config files)
or from ``storage_options``. No message, repr or stored file produced from a Location
contains a secret: URLs lose their user info and query string, and secret values are masked.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import fsspec
from fsspec.implementations.local import LocalFileSystem

from dist_resume.errors import StorageError
from dist_resume.storage.retries import S3_PROTOCOLS, client_defaults

_SECRET_OPTION = re.compile(r"secret|token|password|passwd|credential|signature|sas", re.I)
_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")
_URL_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][\w+.-]*://)[^/@\s]+@")
_URL = re.compile(r"(?P<scheme>[a-zA-Z][\w+.-]+)://(?P<netloc>[^/?#]*)(?P<rest>.*)", re.DOTALL)
_QUERY_PARAMETER = re.compile(r"(?P<name>[^?&#=]+)=(?P<value>[^&#]*)")
# Query parameters that carry credentials: the option names above, Azure SAS's `sig`, keys.
_SECRET_PARAMETER = re.compile(rf"{_SECRET_OPTION.pattern}|^sig$|key", re.I)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def redact_url(url: str) -> str:
    """``url`` as the place it names, safe to print: without user info (credentials), with
    the values of secret-looking query parameters masked, and control characters escaped.
    Everything else stays, ``#`` and ``?`` included: fsspec reads them as part of the path."""
    parts = _URL.fullmatch(url)
    if parts is not None:
        rest = parts["rest"]
        if "?" in rest:
            path, _, query = rest.partition("?")
            rest = path + "?" + _QUERY_PARAMETER.sub(_masked_parameter, query)
        url = f"{parts['scheme']}://{parts['netloc'].rpartition('@')[2]}{rest}"
    return _CONTROL.sub(lambda char: repr(char.group())[1:-1], url)


def _masked_parameter(parameter: re.Match) -> str:
    return f"{parameter['name']}=***" if _SECRET_PARAMETER.search(parameter["name"]) else parameter.group()


def _is_secret(name: str, value: Any) -> bool:
    return isinstance(value, str) and bool(value) and _SECRET_OPTION.search(name) is not None


def _secret_values(options: dict[str, Any]) -> list[str]:
    found = []
    for name, value in options.items():
        if isinstance(value, dict):
            found += _secret_values(value)
        elif _is_secret(name, value):
            found.append(value)
    return found


def _masked(options: dict[str, Any]) -> dict[str, Any]:
    return {name: _masked(value) if isinstance(value, dict) else "***" if _is_secret(name, value) else value
            for name, value in options.items()}


class Secrets(tuple):
    """Secret values, kept to mask them in messages; their repr (what tracebacks that
    capture locals print) shows none of them."""

    def __repr__(self) -> str:
        return f"<{len(self)} secret values>"

    def mask(self, text: str) -> str:
        """``text`` with every secret value replaced by ``***``."""
        for secret in self:
            text = text.replace(secret, "***")
        return text


class StorageOptions(dict):
    """fsspec options whose repr masks the values of secret options (key, token, password...)."""

    def __repr__(self) -> str:
        return repr(_masked(self))


def guarded(options: dict[str, Any] | None) -> StorageOptions:
    """``options`` (a caller's ``storage_options``) as a copy that never shows its secrets."""
    return StorageOptions(options or {})


@dataclass(frozen=True)
class Location:
    """A checkpoint URL resolved to an fsspec filesystem and a path inside it."""

    fs: fsspec.AbstractFileSystem = field(repr=False)
    root: str
    url: str  # redacted: safe to print
    secrets: Secrets = field(repr=False)

    def __repr__(self) -> str:  # tracebacks that record locals must not show secrets
        return f"Location({self.url!r})"

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, LocalFileSystem)

    @property
    def run_key(self) -> tuple[str, str, str | None]:
        """The place this location names, however its URL is spelled: a local directory by
        its real path (a file:// URL, a plain path, a filesystem that wraps the local one),
        else by filesystem, path and endpoint."""
        if self.is_local:
            return ("local", os.path.realpath(self.root), None)
        return (type(self.fs).__name__, self.root, getattr(self.fs, "endpoint_url", None))

    def join(self, *names: str) -> str:
        return "/".join([self.root.rstrip("/"), *names])

    def url_of(self, path: str) -> str:
        """Printable URL of ``path`` (a path inside this location)."""
        return self.url.rstrip("/") + path[len(self.root.rstrip("/")):]

    def redact(self, text: str) -> str:
        """``text`` with secret values masked and URL credentials removed."""
        return _URL_USERINFO.sub(r"\g<scheme>***@", self.secrets.mask(text))

    def error(self, action: str, path: str, exc: BaseException) -> StorageError:
        """A one-line StorageError for ``action`` on ``path`` that failed with ``exc``."""
        if isinstance(exc, PermissionError):
            hint = "access denied, check the credentials"
        elif isinstance(exc, FileNotFoundError):
            hint = "not found"
        else:
            hint = "storage error"
        detail = " ".join(self.redact(str(exc)).split()) or type(exc).__name__
        return StorageError(
            f"cannot {action} {self.url_of(path)}: {hint} ({type(exc).__name__}: {detail})"
        )


def resolve(url: str | os.PathLike, storage_options: dict[str, Any] | None = None) -> Location:
    """Resolve a local path, ``file://``, ``s3://`` or any fsspec URL. A URL that names no
    path, or that carries credentials (they would reach logs), is refused."""
    options = guarded(storage_options)
    del storage_options  # a traceback that captures locals shows the guarded copy only
    text = os.fspath(url)
    secrets = Secrets(_secret_values(options) + [os.environ[name] for name in _SECRET_ENV if os.environ.get(name)])
    printable = redact_url(text)
    if not text:  # fsspec reads "" as the current directory: an unset variable must not mean "here"
        raise StorageError("cannot open storage for '': the checkpoint URL is empty")
    parts = urlsplit(text)
    if len(parts.scheme) > 1:
        if "@" in parts.netloc:
            raise StorageError(
                f"cannot open storage for {printable}: credentials in the URL are refused (they would "
                "reach logs and error reports); give them in storage_options or the environment"
            )
        if not (parts.netloc + parts.path).strip("/"):
            raise StorageError(f"cannot open storage for {printable}: the URL names no path")
    try:
        protocol = fsspec.core.split_protocol(text)[0] or "file"
        fs, root = fsspec.core.url_to_fs(text, **client_defaults(protocol, options))
        if protocol in S3_PROTOCOLS:
            fs.retries = 1  # s3fs's own retry loop (a class attribute, not an option)
    except (ValueError, ImportError, TypeError) as exc:
        raise StorageError(f"cannot open storage for {printable}: {secrets.mask(str(exc))}") from None
    return Location(fs=fs, root=root.rstrip("/") or root, url=printable, secrets=secrets)
