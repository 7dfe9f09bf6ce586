"""Typed errors: every non-2xx answer of the daemon becomes one of these.

The daemon answers errors as ``{"error": {"code": "SANDBOX-...", "message": ...}}``; the class is
chosen by the code first (it is the stable contract) and by the HTTP status otherwise, so an
answer from something in between (a proxy) still maps onto the right family.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import httpx

__all__ = [
    "SandboxError",
    "SandboxConnectionError",
    "ProtocolError",
    "InvalidArgumentError",
    "AuthError",
    "PlanRequiredError",
    "PermissionDeniedError",
    "NotFoundError",
    "ConflictError",
    "VolumeBusyError",
    "SessionStoppedError",
    "PayloadTooLargeError",
    "UnsupportedMediaTypeError",
    "QuotaExceededError",
    "RateLimitedError",
    "InternalError",
    "NotSupportedError",
    "UnavailableError",
    "AgentTimeoutError",
    "error_from_body",
    "raise_for_response",
]


class SandboxError(Exception):
    """Base of every error this SDK raises.

    Attributes:
        code: The daemon's ``SANDBOX-...`` code, or ``None`` when the answer carried none
            (a connection failure, an answer that is not the daemon's error shape).
        message: The human-readable message.
        status: The HTTP status, or ``None`` when there was no HTTP answer (or the error was
            reported inside a stream that had already started with 200).
        details: The optional ``details`` object of the error body.
    """

    def __init__(
        self,
        message: str,
        *,
        code: Optional[str] = None,
        status: Optional[int] = None,
        details: Any = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.details = details

    def __str__(self) -> str:
        prefix = " ".join(str(p) for p in (self.status, self.code) if p is not None)
        return f"{prefix}: {self.message}" if prefix else self.message

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code!r}, status={self.status!r}, "
            f"message={self.message!r})"
        )


class SandboxConnectionError(SandboxError):
    """The daemon could not be reached, or the connection broke mid-answer."""


class ProtocolError(SandboxError):
    """The daemon's answer was not what the API promises (unexpected body or event)."""


class InvalidArgumentError(SandboxError):
    """400 ``SANDBOX-INVALID-ARGUMENT``: the request was malformed or asked for something invalid."""


class AuthError(SandboxError):
    """401 ``SANDBOX-AUTH-001``: missing or invalid API key."""


class PlanRequiredError(SandboxError):
    """402 ``SANDBOX-PLAN-REQUIRED``: the tenant's plan gives no sandbox access."""


class PermissionDeniedError(SandboxError):
    """403 ``SANDBOX-PERMISSION-DENIED``: the operation is refused (read-only image, admin only)."""


class NotFoundError(SandboxError):
    """404 ``SANDBOX-NOT-FOUND``: unknown id, or one of another tenant (they look the same)."""


class ConflictError(SandboxError):
    """409 ``SANDBOX-CONFLICT``: the object's state forbids it (a paused session, a non-empty dir)."""


class VolumeBusyError(ConflictError):
    """409 ``SANDBOX-VOLUME-BUSY``: the volume is mounted read-write elsewhere."""


class SessionStoppedError(SandboxError):
    """410 ``SANDBOX-SESSION-STOPPED``: the session's sandbox died."""


class PayloadTooLargeError(SandboxError):
    """413 ``SANDBOX-PAYLOAD-TOO-LARGE``."""


class UnsupportedMediaTypeError(SandboxError):
    """415 ``SANDBOX-UNSUPPORTED-MEDIA-TYPE``."""


class QuotaExceededError(SandboxError):
    """A tenant or sandbox quota is used up: sessions or minutes (429), disk, snapshot or volume
    storage (507)."""


class RateLimitedError(SandboxError):
    """429 ``SANDBOX-RATE-LIMITED``: too many requests.

    Attributes:
        retry_after: Seconds the daemon asked to wait (``Retry-After``), when it said.
    """

    def __init__(self, message: str, *, retry_after: Optional[float] = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after


class InternalError(SandboxError):
    """500 ``SANDBOX-INTERNAL``: the daemon failed."""


class NotSupportedError(SandboxError):
    """501 ``SANDBOX-NOT-IMPLEMENTED``: this server or runtime does not offer the operation."""


class UnavailableError(SandboxError):
    """503: the runtime is unavailable, or the previewed server is not listening."""


class AgentTimeoutError(SandboxError):
    """504 ``SANDBOX-AGENT-TIMEOUT``: the sandbox's agent did not answer in time."""


_BY_CODE: dict[str, type[SandboxError]] = {
    "SANDBOX-INVALID-ARGUMENT": InvalidArgumentError,
    "SANDBOX-AUTH-001": AuthError,
    "SANDBOX-PLAN-REQUIRED": PlanRequiredError,
    "SANDBOX-PERMISSION-DENIED": PermissionDeniedError,
    "SANDBOX-NOT-FOUND": NotFoundError,
    "SANDBOX-CONFLICT": ConflictError,
    "SANDBOX-VOLUME-BUSY": VolumeBusyError,
    "SANDBOX-SESSION-STOPPED": SessionStoppedError,
    "SANDBOX-PAYLOAD-TOO-LARGE": PayloadTooLargeError,
    "SANDBOX-UNSUPPORTED-MEDIA-TYPE": UnsupportedMediaTypeError,
    "SANDBOX-QUOTA-SESSIONS": QuotaExceededError,
    "SANDBOX-QUOTA-MINUTES": QuotaExceededError,
    "SANDBOX-FS-QUOTA-EXCEEDED": QuotaExceededError,
    "SANDBOX-QUOTA-SNAPSHOT-STORAGE": QuotaExceededError,
    "SANDBOX-QUOTA-VOLUME-STORAGE": QuotaExceededError,
    "SANDBOX-RATE-LIMITED": RateLimitedError,
    "SANDBOX-INTERNAL": InternalError,
    "SANDBOX-NOT-IMPLEMENTED": NotSupportedError,
    "SANDBOX-RUNTIME-UNAVAILABLE-001": UnavailableError,
    "SANDBOX-PREVIEW-NOT-LISTENING": UnavailableError,
    "SANDBOX-AGENT-TIMEOUT": AgentTimeoutError,
}

_BY_STATUS: dict[int, type[SandboxError]] = {
    400: InvalidArgumentError,
    401: AuthError,
    402: PlanRequiredError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    410: SessionStoppedError,
    413: PayloadTooLargeError,
    415: UnsupportedMediaTypeError,
    429: RateLimitedError,
    500: InternalError,
    501: NotSupportedError,
    503: UnavailableError,
    504: AgentTimeoutError,
    507: QuotaExceededError,
}


def _retry_after(headers: Optional[httpx.Headers]) -> Optional[float]:
    value = headers.get("retry-after") if headers is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def error_from_body(
    body: Any, status: Optional[int], headers: Optional[httpx.Headers] = None
) -> SandboxError:
    """Builds the typed error for an error body (parsed JSON, or anything else) and a status."""
    detail = body.get("error") if isinstance(body, dict) else None
    if isinstance(detail, dict) and isinstance(detail.get("code"), str):
        code: Optional[str] = detail["code"]
        message = str(detail.get("message", ""))
        details = detail.get("details")
    else:
        code, details = None, None
        message = body if isinstance(body, str) and body else f"HTTP {status}"
    cls = _BY_CODE.get(code or "") or _BY_STATUS.get(status or 0, SandboxError)
    kw: dict[str, Any] = {"code": code, "status": status, "details": details}
    if cls is RateLimitedError:
        kw["retry_after"] = _retry_after(headers)
    return cls(message, **kw)


def raise_for_response(response: httpx.Response) -> None:
    """Raises the typed error of a non-2xx answer whose body has been read; returns otherwise."""
    if response.is_success:
        return
    try:
        body: Any = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = response.text.strip()[:500]
    raise error_from_body(body, response.status_code, response.headers)
