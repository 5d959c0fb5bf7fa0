"""The upstream fixture server, started and stopped by each test that uses it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.apis_e2e.upstream import Upstream


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    server = await Upstream().start()
    try:
        yield server
    finally:
        await server.stop()
