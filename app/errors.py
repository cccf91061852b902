"""Hearth's error tree. The server maps each type to its wire shape in one place.
Tested by tests/server/test_security.py and tests/server/clients/test_ollama_edges.py."""

from __future__ import annotations


class HearthError(Exception):
    """Base of every error Hearth raises on purpose.

    ``status`` and ``code`` are what an HTTP edge answers; ``param`` names the offending field.
    """

    status: int = 500
    code: str | None = "internal_error"
    type: str = "server_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequest(HearthError):
    status = 400
    code = "invalid_request"
    type = "invalid_request_error"


class UnsupportedParameter(InvalidRequest):
    code = "unsupported_parameter"


class NotSupported(InvalidRequest):
    """The model's engine cannot serve this kind of request (yet): a remote engine asked for
    count_tokens or rerank, say."""

    code = "not_supported"


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"


class ModelNotFound(HearthError):
    status = 404
    code = "model_not_found"
    type = "invalid_request_error"


class InvalidModel(HearthError):
    """A model file failed validation (bad GGUF header, unreadable folder)."""

    status = 400
    code = "invalid_model"
    type = "invalid_request_error"


class ModelLoadFailed(HearthError):
    status = 500
    code = "model_load_failed"
    type = "server_error"


class RuntimeUnavailable(HearthError):
    status = 501
    code = "runtime_unavailable"
    type = "server_error"


class QueueFull(HearthError):
    status = 429
    code = "queue_full"
    type = "rate_limit_error"

    def __init__(self, message: str, *, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ModelUnloaded(HearthError):
    """The model was unloaded (by a user, eviction, keep-alive or shutdown) while a request
    still needed it; the request ends, the server goes on. A retry loads it again.

    ``raced``: the unload began between the request finding the model and submitting to it,
    so nothing of the request ran (the gateway loads the model again and retries it once)."""

    status = 503
    code = "model_unloaded"
    type = "server_error"

    def __init__(self, message: str, *, retry_after: int = 1, raced: bool = False) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.raced = raced


class ModelBusy(HearthError):
    """A reload with other options was asked for while requests run on the model; retry when
    they finish, or ask to wait for them."""

    status = 409
    code = "model_busy"
    type = "invalid_request_error"

    def __init__(self, message: str, *, pending: int) -> None:
        super().__init__(message, param="model")
        self.pending = pending


class AlreadyExists(InvalidRequest):
    """A create naming something that exists already (a key's name): remove it first."""

    status = 409
    code = "already_exists"


class NotFound(HearthError):
    """A named thing that is not there (a key, a provider) on a management route."""

    status = 404
    code = "not_found"
    type = "invalid_request_error"


class Forbidden(HearthError):
    """A Host or Origin the server does not allow."""

    status = 403
    code = "forbidden"
    type = "invalid_request_error"


class PermissionDenied(HearthError):
    """A key without the admin role on a management route."""

    status = 403
    code = "permission_denied"
    type = "invalid_request_error"


class RateLimited(HearthError):
    """A key's (or the server's) requests or tokens per minute are spent."""

    status = 429
    code = "rate_limit_exceeded"
    type = "rate_limit_error"

    def __init__(self, message: str, *, retry_after: int | None = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RequestOverRateLimit(RateLimited):
    """One request that can cost more tokens than its key (or the server) allows in a whole
    minute: it would never be admitted as sent, so no Retry-After."""

    code = "request_over_rate_limit"

    def __init__(self, message: str) -> None:
        super().__init__(message, retry_after=None)


class Unauthorized(HearthError):
    """A missing or wrong API key."""

    status = 401
    code = "invalid_api_key"
    type = "invalid_request_error"


class HTTPStatusError(HearthError):
    """An HTTP-level refusal (no such route, wrong method...) in the protocol's error shape."""

    type = "invalid_request_error"

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class GenerationCancelled(HearthError):
    status = 499
    code = "cancelled"
    type = "server_error"


class GenerationTimeout(HearthError):
    status = 504
    code = "timeout"
    type = "server_error"


class TemplateError(InvalidRequest):
    code = "template_error"


class DownloadFailed(HearthError):
    status = 502
    code = "download_failed"


class ServerError(HearthError):
    """The embedded server could not start (port busy, bad bind address)."""

    status = 500
    code = "server_error"


class ConfigError(HearthError):
    status = 400
    code = "config_error"


class InsufficientMemory(HearthError):
    """Loading would exceed the memory budget even after evicting idle models."""

    status = 507
    code = "insufficient_memory"
    type = "server_error"

    def __init__(self, message: str, *, needed: int, available: int) -> None:
        super().__init__(message, param="model")
        self.needed = needed
        self.available = available


class StateUnavailable(HearthError):
    """The shared state (Redis) cannot be reached and what was asked needs it: a change to the
    shared keys, or a limited key's admission with ``state.limits_on_failure: closed``."""

    status = 503
    code = "state_unavailable"
    type = "server_error"

    def __init__(self, message: str, *, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


# -- remote engines (providers) ---------------------------------------------------------
class ProviderUnavailable(HearthError):
    """A remote engine that is not there: connection refused or reset, DNS failure, no answer
    within its timeouts, or a provider not ready (starting, unreachable). Retryable: a fallback
    chain tries its next target."""

    status = 503
    code = "provider_unavailable"
    type = "server_error"
    retryable = True

    def __init__(self, message: str, *, provider: str, retry_after: int = 2) -> None:
        super().__init__(message, param="model")
        self.provider = provider
        self.retry_after = retry_after


class ProviderTimeout(ProviderUnavailable):
    """The engine took longer than the provider's first-token timeout to start answering."""

    status = 504
    code = "provider_timeout"


class ProviderError(HearthError):
    """A remote engine's own error answer, translated (the provider named, its message kept).
    4xx keep their status and answer at once (the request would fail anywhere); 429 and 5xx
    are retryable (a 5xx is answered as 502: the fault is upstream)."""

    code = "provider_error"
    type = "server_error"

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        status: int,
        param: str | None = None,
        upstream_retry_after: float | None = None,
    ) -> None:
        super().__init__(message, param=param)
        self.provider = provider
        self.upstream_status = status
        # the engine's own Retry-After (seconds) on a 429 or 503: its replica cools down that long
        self.upstream_retry_after = upstream_retry_after
        self.retryable = status == 429 or status >= 500 or status == 0
        self.status = status if 400 <= status < 500 else 502
        if status == 429:
            self.code, self.type, self.retry_after = "rate_limited", "rate_limit_error", 1
        elif status in (401, 403):
            self.code, self.type = "provider_unauthorized", "authentication_error"
        elif status == 404:
            self.code, self.type = "model_not_found", "invalid_request_error"
        elif 400 <= status < 500:
            self.type = "invalid_request_error"


# -- Hugging Face Hub and downloads ----------------------------------------------------------------
class RepoNotFound(HearthError):
    """The repo (or file) does not exist on the Hub, or it is private and the token cannot see it."""

    status = 404
    code = "repo_not_found"
    type = "invalid_request_error"


class RepoRefused(HearthError):
    """Hearth will not download this repo or file (pickle weights, remote code, hostile names)."""

    status = 400
    code = "repo_refused"
    type = "invalid_request_error"


class AccessDenied(HearthError):
    """A gated or private repo that the configured token (or no token) cannot download."""

    status = 403
    code = "gated_repo"
    type = "invalid_request_error"

    def __init__(self, message: str, *, url: str | None = None) -> None:
        super().__init__(message)
        self.url = url


class AmbiguousChoice(InvalidRequest):
    """A pull without a quantization or file name in a repo with several choices."""

    code = "ambiguous_choice"

    def __init__(self, message: str, *, choices: list[str]) -> None:
        super().__init__(message, param="model")
        self.choices = choices


class HubUnavailable(HearthError):
    """The Hub (or its CDN) could not be reached or kept failing."""

    status = 502
    code = "hub_unavailable"


class HubOffline(HubUnavailable):
    """The Hub cannot be reached at all (offline, a name that does not resolve, nothing listening):
    found out in seconds, before any request is retried."""


class ChecksumMismatch(DownloadFailed):
    code = "checksum_mismatch"


class InsufficientStorage(DownloadFailed):
    status = 507
    code = "insufficient_storage"


class DownloadNotFound(HearthError):
    status = 404
    code = "download_not_found"
    type = "invalid_request_error"


class DownloadCancelled(HearthError):
    status = 499
    code = "cancelled"


class UnreadableAttachment(InvalidRequest):
    """A file attached to a chat that Hearth cannot read as text (binary, encrypted or
    image-only PDF, over the size cap): the message says which and why."""

    code = "unreadable_attachment"


class NoEmbeddingModel(InvalidRequest):
    """Attached files do not fit the model's context and no embedding model is there to pick
    the relevant parts of them."""

    code = "no_embedding_model"
