"""Fuzz a FastAPI service against its own OpenAPI schema with schemathesis, in process (tests/test_fuzz_*.py).

Why not schemathesis's pytest plugin: its lazy loader (``schemathesis.pytest.from_fixture``) sets
``request.node._nodeid``, which pytest 9 no longer has, and the eager one needs the app at import time
(loading models during collection of the whole suite). So this helper drives schemathesis's own strategies
with hypothesis: for every operation of the schema, ``max_examples`` requests that fit the schema
(positive) and ``max_examples`` that break it (negative; operations without any input have none), each
sent through schemathesis's ASGI transport and checked with all its default checks (no 5xx, status codes,
content types and bodies as declared, invalid input rejected, auth enforced) plus the service's own
``checks``. Hypothesis runs derandomized (a fixed seed) with no example database, so a run is repeatable.

``pin`` lets a test steer a share of the generated requests at real objects (a live instance id, a stored
workspace), so the fuzzer reaches the code behind "unknown id" answers too.

Failures are collected over all operations and reported together (method, path, the curl line).

Apps are function-scoped fixtures: schemathesis's pytest plugin (loaded by its entry point) ends the
lifespan of every app its ASGI transport started when a test ends, so an app shared between tests would
meet its second test shut down (the memory service with its store closed).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis.generation.modes import GenerationMode

__all__ = ["Check", "fuzz_schema", "json_error_names_field"]

#: A schemathesis check: (ctx, response, case) -> None, raising AssertionError on a failure.
Check = Callable[[Any, Any, Any], Any]
#: Steers a generated case: (case, hypothesis data) -> None, may edit case.body / path_parameters / query.
Pin = Callable[[Any, st.DataObject], None]


def json_error_names_field(error_key: str = "error", field_key: str = "field",
                           fieldless: Iterable[str] = ()) -> Check:
    """A check: every 4xx/5xx answer is JSON whose ``error`` object names the request field to fix.

    ``fieldless``: error codes that are about the service, not a field (``too_many_instances``).
    """
    allowed = frozenset(fieldless)

    def error_names_field(ctx: Any, response: Any, case: Any) -> None:
        if response.status_code < 400:
            return
        try:
            body = response.json()
        except ValueError:
            raise AssertionError(f"error {response.status_code} is not JSON: {response.text[:300]!r}") from None
        error = body.get(error_key) if isinstance(body, dict) else None
        assert isinstance(error, dict), f"error {response.status_code} has no {error_key!r} object: {body}"
        assert error.get("message"), f"error {response.status_code} has no message: {body}"
        if error.get("code") in allowed or error.get("type") in allowed:
            return
        assert error.get(field_key), f"error {response.status_code} names no field ({field_key!r}): {body}"

    return error_names_field


def fuzz_schema(schema: Any, *, max_examples: int, headers: dict[str, str] | None = None,
                checks: Iterable[Check] = (), pin: Pin | None = None,
                skip: Iterable[str] = ()) -> dict[str, int]:
    """Run every operation of ``schema`` (``schemathesis.openapi.from_asgi``) positive and negative.

    Returns how many requests each operation got (``"POST /step": 24``); raises AssertionError listing
    every failure found. ``skip``: operation labels not to fuzz (say why in the caller).
    """
    extra_checks = list(checks)
    skipped = set(skip)
    failures: list[str] = []
    counts: dict[str, int] = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.label in skipped:
            continue
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            _fuzz_operation(operation, mode, max_examples, headers, extra_checks, pin, counts, failures)
    if failures:
        raise AssertionError(f"{len(failures)} operation(s) failed the schema fuzz:\n\n" + "\n\n".join(failures))
    return counts


def _fuzz_operation(operation: Any, mode: GenerationMode, max_examples: int, headers: dict[str, str] | None,
                    checks: list[Check], pin: Pin | None, counts: dict[str, int], failures: list[str]) -> None:
    @given(case=operation.as_strategy(generation_mode=mode), data=st.data())
    @settings(max_examples=max_examples, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate, Phase.shrink])
    def run(case: Any, data: st.DataObject) -> None:
        if pin is not None and mode is GenerationMode.POSITIVE:
            pin(case, data)
        if headers:  # the real credentials win over generated ones (ignored_auth probes bad ones itself)
            case.headers = {**(case.headers or {}), **headers}
        counts[operation.label] = counts.get(operation.label, 0) + 1
        case.call_and_validate(headers=headers, additional_checks=checks)

    try:
        run()
    except Unsatisfiable:
        pass  # no negative input exists (an operation without parameters or body)
    except (Exception, BaseExceptionGroup) as err:  # every failure is reported below
        if "Unable to satisfy assumptions" in str(err):
            return
        failures.append(f"{operation.label} ({mode.value}): {err}")


def asgi_schema(app: Any, *, domain_rejections: Iterable[int] = (422,)) -> Any:
    """The schema of an in-process app, loaded from its own ``/openapi.json``.

    ``domain_rejections``: statuses a schema-valid request may still get, besides schemathesis's defaults
    (401, 403, 404, 409, 429): a JSON schema cannot say that an action does not apply to the environment's
    state, or that a workspace is empty; those answers are 422 naming the field, which
    :func:`json_error_names_field` checks.
    """
    from schemathesis.config import SchemathesisConfig

    accepted = ["2xx", "3xx", "401", "403", "404", "409", "429", *map(str, domain_rejections)]
    config = SchemathesisConfig.from_dict({"checks": {"positive_data_acceptance": {"expected-statuses": accepted}}})
    return schemathesis.openapi.from_asgi("/openapi.json", app, config=config)


def stop_apps() -> None:
    """Run the shutdown of every app schemathesis started (its ASGI transport keeps lifespans running)."""
    from schemathesis.python import asgi

    asgi.shutdown_lifespans()
