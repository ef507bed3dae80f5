"""What a failed LLM request means, and what the user should change: the words of every :class:`LLMError`.

One endpoint's :class:`EndpointFailures` sorts each exception the SDK raises into a retryable failure (the
retry policy in :mod:`.retry` waits and asks again), a refused ``response_format`` (asked again without it)
or a final :class:`LLMError` whose message names the config key to fix -- the point of the message.
"""

from __future__ import annotations

import json

import openai

from agentevolver.client.llm_config import LLMEndpointConfig
from agentevolver.client.llm_wire import short
from agentevolver.client.retry import RetryableFailure, is_retryable_status, retry_after_s
from agentevolver.client.structured_output import is_format_refusal
from agentevolver.errors import LLMError

__all__ = ["EndpointFailures", "FormatRefused"]


class FormatRefused(Exception):
    """The server refused the request's ``response_format`` (HTTP 400/422 naming it); not retried as is."""


class EndpointFailures:
    """Failures of one endpoint, named after it: ``where`` (for messages and logs) and ``config_key``
    (``llm.endpoints.<name>``, what to edit). ``key_is_set`` says whether a real API key was sent."""

    def __init__(self, endpoint: LLMEndpointConfig, name: str | None, *, key_is_set: bool) -> None:
        self.endpoint = endpoint
        self.key_is_set = key_is_set
        self.config_key = f"llm.endpoints.{name}" if name else "llm.endpoints.<name>"
        self.where = (
            f"LLM endpoint {name or ''}".rstrip() + f" (base_url={endpoint.base_url}, model={endpoint.model})"
        )

    def classify(self, exc: Exception, format_added: bool = False) -> Exception:
        """Map an exception from the SDK call to :class:`RetryableFailure`, :class:`FormatRefused` (the server
        does not take the ``response_format`` the client added) or a final :class:`LLMError`."""
        ep = self.endpoint
        if (format_added and isinstance(exc, openai.APIStatusError)
                and is_format_refusal(exc.status_code, exc.body, exc.message)):
            return FormatRefused(f"HTTP {exc.status_code}: {short(exc.message)}")
        if isinstance(exc, openai.APITimeoutError):
            return RetryableFailure(f"no reply within timeout_s={ep.timeout_s} s")
        if isinstance(exc, openai.APIConnectionError):
            cause = exc.__cause__ or exc.__context__
            detail = f": {cause}" if cause is not None and str(cause) else ""
            return RetryableFailure(f"could not connect to {ep.base_url}{detail}")
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            detail = short(exc.message)
            if is_retryable_status(status):
                return RetryableFailure(
                    f"HTTP {status}: {detail}", retry_after_s=retry_after_s(exc.response.headers)
                )
            return LLMError(f"{self.where} answered HTTP {status} ({detail}); {self.fix_for(status)}")
        if isinstance(exc, json.JSONDecodeError):
            return RetryableFailure(f"reply body is not JSON ({exc})")
        return LLMError(
            f"{self.where}: request failed with {type(exc).__name__}: {short(str(exc))}; check the request "
            f"arguments and that {ep.base_url} is an OpenAI-compatible server"
        )

    def fix_for(self, status: int) -> str:
        """What the user should change for a non-retryable HTTP status."""
        ep, key = self.endpoint, self.config_key
        if status == 401:
            if ep.api_key_env is None:
                return (
                    f"the endpoint wants an API key: set {key}.api_key_env to the name of an env var "
                    "and export the key in it"
                )
            if not self.key_is_set:
                return f"set the env var {ep.api_key_env} to the API key (it is unset, so a placeholder was sent)"
            return f"the key in env var {ep.api_key_env} was rejected: check it is valid for {ep.base_url}"
        if status == 403:
            return (
                f"the API key (env var {ep.api_key_env}) may not use model {ep.model!r}: check the key's "
                f"permissions or {key}.model"
            )
        if status == 404:
            return (
                f"check {key}.model (does the server serve {ep.model!r}?) and {key}.base_url "
                "(OpenAI-compatible base URLs usually end in /v1)"
            )
        if status in (400, 413, 422):
            return (
                "the server rejected the request itself: check the messages and sampling arguments "
                f"(is max_tokens={ep.max_tokens} plus the prompt within the model's context window? "
                "are extra keyword arguments supported by this server?)"
            )
        return f"HTTP {status} is not retryable; check {key} and the server's logs"

    def exhausted(self, failure: RetryableFailure, attempts: int) -> LLMError:
        """Retries ran out: the last failure, and what to raise if the server is only slow."""
        ep, key = self.endpoint, self.config_key
        return LLMError(
            f"{self.where} failed after {attempts} attempt(s) (max_retries={ep.max_retries}); last error: "
            f"{failure.reason}. Check that the server is up and reachable at {ep.base_url}; if it is only slow "
            f"or rate-limited, raise {key}.timeout_s or {key}.max_retries, or lower {key}.max_concurrency."
        )

    def format_refused(self, kind: str, message: str) -> LLMError:
        """A refused ``response_format`` under an explicit ``structured_output`` mode (not ``auto``)."""
        return LLMError(f"{self.where} refused response_format {kind!r} ({short(message)}); this server "
                        f"does not take it: set {self.config_key}.structured_output to auto or off")
