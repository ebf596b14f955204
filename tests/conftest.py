"""Shared fixtures: one suite, two backends.

``backend_url`` is parametrized over SQLite and PostgreSQL. SQLite gets a fresh file per
test. PostgreSQL gets one throwaway database per test session (and per xdist worker),
created here and dropped at the end; each test starts from empty tables. When PostgreSQL
is unreachable the fixture raises, so the run fails instead of quietly skipping half the
suite. ``TIDINGS_TEST_PG`` points at the server (default: the local trust-auth server).
"""

from __future__ import annotations

import os
import secrets
import signal
from collections.abc import Iterator

import pytest

from helpers import truncate_pg
from tidings.clock import FakeClock
from tidings.faults import Faults
from tidings.store.engine import Store

# A run launched in the background (a script's ``&``, ``nohup``) inherits SIGINT ignored, and
# an ignored signal stays ignored in every child: the Ctrl-C tests' processes would never
# see theirs. Give it back its default handling (D112, tests/test_suite_sigint.py).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

PG_ADMIN_URL = os.environ.get("TIDINGS_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
BACKENDS = ["sqlite", "postgres"]


def _pg_admin():
    import psycopg

    try:
        return psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5)
    except Exception as exc:  # noqa: BLE001 - we want the reason in the failure
        raise RuntimeError(
            f"PostgreSQL is unreachable at {PG_ADMIN_URL} ({exc}); the suite runs every store "
            "test on both backends, so this is a failure, not a skip"
        ) from exc


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A throwaway PostgreSQL database for this session; dropped afterwards."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    name = f"tidings_test_{worker}_{secrets.token_hex(4)}"
    with _pg_admin() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    url = f"{base}/{name}"
    # Apply migrations once, so per-test truncation is all that is left to do.
    Store(url).dispose()
    try:
        yield url
    finally:
        with _pg_admin() as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
            )
            admin.execute(f'DROP DATABASE IF EXISTS "{name}"')


@pytest.fixture(params=BACKENDS)
def backend_url(request, tmp_path) -> str:
    """A database URL for an empty, migrated store: a SQLite file or a PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "tidings.db")
    url = request.getfixturevalue("pg_database")
    truncate_pg(url)
    return url


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def faults() -> Faults:
    return Faults()


@pytest.fixture
def store(backend_url, clock, faults) -> Iterator[Store]:
    s = Store(backend_url, clock=clock, faults=faults)
    try:
        yield s
    finally:
        s.dispose()


ADMIN_TOKEN = "tdg_test_admin"


@pytest.fixture
def runtime(backend_url, clock, faults):
    """A hub process over a fresh database (engines not started unless a test starts them)."""
    from tidings.runtime import Runtime

    rt = Runtime(backend_url, clock=clock, faults=faults, admin_token=ADMIN_TOKEN)
    try:
        yield rt
    finally:
        rt.stop()


@pytest.fixture
def client(runtime):
    """An HTTP client for the app over ``runtime`` (admin token in ``client.admin``)."""
    from fastapi.testclient import TestClient

    from tidings.api import create_app

    with TestClient(create_app(runtime), raise_server_exceptions=False) as c:
        c.admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        yield c


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "postgres_only: a PostgreSQL failure mode or race; not collected for SQLite"
    )
    config.addinivalue_line("markers", "sqlite_only: a SQLite-specific mechanism; not collected for PostgreSQL")


def pytest_collection_modifyitems(config, items):
    """Drop the other backend's instances of ``postgres_only`` / ``sqlite_only`` tests
    (deselected, never skipped: a skip in this suite always means something is wrong)."""
    keep, dropped = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        backend = callspec.params.get("backend_url") if callspec else None
        if (item.get_closest_marker("postgres_only") and backend == "sqlite") or (
            item.get_closest_marker("sqlite_only") and backend == "postgres"
        ):
            dropped.append(item)
        else:
            keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
