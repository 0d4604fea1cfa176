"""Retries of transient storage errors, within a time budget.

Object-store clients retry on their own (botocore 5 times, s3fs 5 times): stacked under ours
they turned an unreachable endpoint into a minute of silence. On S3 we therefore default
both to a single attempt (unless ``storage_options`` says otherwise) and keep one layer of
retries here: at most ``RETRY_ATTEMPTS`` attempts, none started after the budget of
``DIST_RESUME_RETRY_SECONDS`` (default 10 s) has passed.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

RETRY_ATTEMPTS = 5
RETRY_BASE_DELAY = 0.2  # seconds; doubles at each attempt
RETRY_SECONDS_ENV = "DIST_RESUME_RETRY_SECONDS"
DEFAULT_RETRY_SECONDS = 10.0
# errnos s3fs (and the OS) use for throttling, server errors and dropped connections.
_TRANSIENT_ERRNOS = {
    errno.EBUSY,
    getattr(errno, "EREMOTEIO", errno.EIO),
    errno.ECONNRESET,
    errno.ECONNABORTED,
    errno.ECONNREFUSED,
    errno.ETIMEDOUT,
    errno.EPIPE,
}
_THROTTLING_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout",
                     "RequestLimitExceeded", "TooManyRequests"}
_CONNECTION_ERRORS = {"ServerDisconnectedError", "ClientConnectionError", "ClientOSError",
                      "EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError"}


def retry_budget() -> float:
    """Seconds after which no new attempt starts (``DIST_RESUME_RETRY_SECONDS``)."""
    text = os.environ.get(RETRY_SECONDS_ENV)
    if text is None:
        return DEFAULT_RETRY_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise ValueError(f"{RETRY_SECONDS_ENV} must be a number of seconds >= 0, got {text!r}")
    return seconds


def _error_chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def is_transient(exc: BaseException) -> bool:
    """True for throttling, server-side (5xx) errors, timeouts and dropped connections."""
    for err in _error_chain(exc):
        if isinstance(err, (ConnectionError, TimeoutError)):
            return True
        if isinstance(err, OSError) and err.errno in _TRANSIENT_ERRNOS:
            return True
        response = getattr(err, "response", None)
        if isinstance(response, dict):  # botocore ClientError
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if status >= 500 or status == 429:
                return True
            if response.get("Error", {}).get("Code") in _THROTTLING_CODES:
                return True
        if type(err).__name__ in _CONNECTION_ERRORS:
            return True
    return False


def retry(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call ``fn``, retrying transient errors with exponential backoff within the budget;
    re-raise the last error."""
    deadline = time.monotonic() + retry_budget()
    for attempt in range(RETRY_ATTEMPTS):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            delay = RETRY_BASE_DELAY * 2**attempt
            last = attempt == RETRY_ATTEMPTS - 1 or time.monotonic() + delay > deadline
            if last or not is_transient(exc):
                raise
            time.sleep(delay)
    raise AssertionError("unreachable")


S3_PROTOCOLS = ("s3", "s3a")


def client_defaults(protocol: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with botocore's own retries turned off where the caller did not configure
    them (ours above are the one layer), and a short connect timeout."""
    if protocol not in S3_PROTOCOLS:
        return options
    options = dict(options)
    config = dict(options.get("config_kwargs") or {})
    config.setdefault("retries", {"mode": "standard", "max_attempts": 1})
    config.setdefault("connect_timeout", 3)
    options["config_kwargs"] = config
    return options
