"""Fixtures for end-to-end tests against real engine processes (tests/e2e/engines.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.engines import EngineSet


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineSet]:
    """Start engines with `engines.hearth(...)`, `.llama_cpp_python(...)`, `.llama_server(...)`;
    all of them are closed when the module's tests are done, pass or fail."""
    es = EngineSet(tmp_path_factory.mktemp("engines"))
    try:
        yield es
    finally:
        es.close()
