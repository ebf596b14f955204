"""PostgreSQL statements on the wire: one libpq pipeline per round trip, each statement
prepared once per connection.

``Tx`` sends the store's statements through here instead of a psycopg cursor each. The
values are psycopg's own: parameters are dumped and rows loaded by psycopg's
``Transformer`` for the connection, so a value means exactly what it means through a
cursor, and errors are psycopg's own classes. What is left out is the cursor machinery
around them. On this 2-core machine that machinery cost about 40 µs of client CPU per
statement against libpq's 6, and the client's CPU, not the network, was the wall of a
frame (D101; ``bench/run.py``'s "a statement, µs" rows).

Guarantees of ``Wire.run``:

* The batch goes out in order in one pipeline and one round trip, and every result is
  read before it returns. The connection is left as psycopg left it: out of pipeline mode,
  nothing pending, in the transaction state the server reports.
* The first error is raised once the pipeline is drained, as psycopg would raise it. The
  server skips the statements after it (``PIPELINE_ABORTED``); their results stay empty.
  The error's ``tidings_result`` is the ``Result`` of the statement it belongs to (None
  for a statement nobody reads), so the caller knows whose error it is.
* A statement whose parameters are known (``params`` not None) runs as a prepared
  statement, prepared in the same pipeline the first time this connection sends it with
  these parameter types. Parse and plan happen once per connection, not once per call. A
  prepare that did not succeed is forgotten, so the next send prepares again.
* Waiting for the socket releases the GIL (``select``), as psycopg's own waits do.

The connection must not let psycopg prepare statements of its own (``Store`` sets
``prepare_threshold = None`` at connect): psycopg answers a ROLLBACK or a DROP it sees by
deallocating every prepared statement of the session, the wire's included.
"""

from __future__ import annotations

import select
from collections.abc import Iterator, Sequence
from typing import Any

from psycopg import errors as pg_errors
from psycopg import pq
from psycopg._queries import _query2pg_nocache
from psycopg.adapt import Transformer

_TUPLES_OK = pq.ExecStatus.TUPLES_OK
_PIPELINE_SYNC = pq.ExecStatus.PIPELINE_SYNC
_FATAL_ERROR = pq.ExecStatus.FATAL_ERROR
_PIPELINE_ABORTED = pq.ExecStatus.PIPELINE_ABORTED
_NO_SUCH_PREPARED = "26000"  # invalid_sql_statement_name

#: Prepared statements kept per connection. A statement's parameter types are part of its
#: key, so one SQL text may take a few; past this many, statements run unnamed.
MAX_PREPARED = 2_000


class Result:
    """The outcome of one statement, read like a DBAPI cursor: ``fetchone``, ``fetchall``,
    ``fetchmany``, iteration, ``rowcount``, ``description`` (``(name,)`` per column) and
    ``close``. Empty until its pipeline has run; rows are loaded on first read."""

    __slots__ = ("_wire", "_res", "_rows", "_pos")

    def __init__(self) -> None:
        self._wire: Wire | None = None
        self._res: pq.abc.PGresult | None = None
        self._rows: list[tuple[Any, ...]] | None = None
        self._pos = 0

    def _fill(self, wire: Wire, res: pq.abc.PGresult) -> None:
        self._wire = wire
        self._res = res

    def _loaded(self) -> list[tuple[Any, ...]]:
        rows = self._rows
        if rows is None:
            res = self._res
            if res is None or res.status != _TUPLES_OK or self._wire is None:
                rows = []
            else:
                rows = self._wire.load(res)
            self._rows = rows
        return rows

    @property
    def rowcount(self) -> int:
        res = self._res
        if res is None:
            return -1
        if res.status == _TUPLES_OK:
            return int(res.ntuples)
        n = res.command_tuples
        return -1 if n is None else int(n)

    @property
    def description(self) -> list[tuple[str]] | None:
        res = self._res
        if res is None or res.status != _TUPLES_OK or self._wire is None:
            return None
        encoding = self._wire.encoding
        return [((res.fname(i) or b"").decode(encoding),) for i in range(res.nfields)]

    def fetchone(self) -> tuple[Any, ...] | None:
        rows = self._loaded()
        if self._pos >= len(rows):
            return None
        self._pos += 1
        return rows[self._pos - 1]

    def fetchmany(self, size: int = 1) -> list[tuple[Any, ...]]:
        rows = self._loaded()
        out = rows[self._pos:self._pos + size]
        self._pos += len(out)
        return out

    def fetchall(self) -> list[tuple[Any, ...]]:
        rows = self._loaded()
        out = rows[self._pos:] if self._pos else rows
        self._pos = len(rows)
        return out

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self.fetchall())

    def close(self) -> None:
        self._rows = None
        self._res = None


#: One statement of a batch: SQL text with psycopg placeholders, its parameters (None: the
#: text as is, sent unnamed) and the ``Result`` to fill (None: nobody reads it).
Entry = tuple[str, Any, "Result | None"]


class Wire:
    """The libpq side of one psycopg connection, used by one thread at a time."""

    __slots__ = ("pgconn", "encoding", "_tx", "_prepared", "_converted")

    def __init__(self, conn: Any) -> None:
        self.pgconn = conn.pgconn
        self._tx = Transformer(conn)
        self.encoding = self._tx.encoding
        self._prepared: dict[tuple[bytes, tuple[int, ...]], bytes] = {}
        # SQL text -> (libpq text with $n, psycopg's formats, parameter names in $n order).
        self._converted: dict[str, tuple[bytes, list[Any], list[str]]] = {}

    def _convert(self, sql: str) -> tuple[bytes, list[Any], list[str]]:
        """psycopg's own placeholder conversion, done once per SQL text."""
        hit = self._converted.get(sql)
        if hit is None:
            query, formats, order, _parts = _query2pg_nocache(sql.encode(self.encoding), self.encoding)
            hit = self._converted[sql] = (query, formats, order or [])
        return hit

    def load(self, res: pq.abc.PGresult) -> list[tuple[Any, ...]]:
        tx = self._tx
        tx.set_pgresult(res)
        rows: list[tuple[Any, ...]] = tx.load_rows(0, res.ntuples, tuple)
        return rows

    def run(self, batch: Sequence[Entry]) -> None:
        """Send ``batch`` in one pipeline, fill its results, raise its first error."""
        pgconn = self.pgconn
        prepared = self._prepared
        # Everything is converted before anything is sent: a parameter that cannot be
        # adapted raises with nothing on the wire.
        calls: list[tuple[Any, tuple[Any, ...]]] = []
        # Per statement sent: (its Result or None, the prepare key it introduced or None).
        sent: list[tuple[Result | None, tuple[bytes, tuple[int, ...]] | None]] = []
        try:
            for sql, params, result in batch:
                self._queue(calls, sent, sql, params, result)
        except BaseException:
            for _, introduced in sent:
                if introduced is not None:
                    prepared.pop(introduced, None)
            raise
        pgconn.enter_pipeline_mode()
        try:
            for send, args in calls:
                send(*args)
            pgconn.pipeline_sync()
            self._flush()
            error: pq.abc.PGresult | None = None
            # The statement the first error belongs to (a failed prepare: the statement it
            # was for, the next one sent), handed to the caller as ``exc.tidings_result``.
            owner: Result | None = None
            owner_next = False
            for result, introduced in sent:
                res = self._next()
                while self._next() is not None:
                    pass  # each statement's results end with a NULL
                if res is None:  # pragma: no cover - libpq always reports a status
                    continue
                status = res.status
                if status == _FATAL_ERROR or status == _PIPELINE_ABORTED:
                    if introduced is not None:
                        prepared.pop(introduced, None)  # not prepared after all
                    if status == _FATAL_ERROR and error is None:
                        error = res
                        owner, owner_next = result, introduced is not None
                    elif owner_next and introduced is None:
                        owner, owner_next = result, False
                    continue
                if result is not None:
                    result._fill(self, res)
            sync = self._next()
            if sync is None or sync.status != _PIPELINE_SYNC:  # pragma: no cover - protocol
                raise pg_errors.InternalError("the pipeline did not end with its sync")
        finally:
            if pgconn.pipeline_status:
                try:
                    pgconn.exit_pipeline_mode()
                except Exception:  # noqa: BLE001 - a broken link: the statement error says why
                    pass
        if error is not None:
            exc = pg_errors.error_from_result(error, encoding=self.encoding)
            if exc.sqlstate == _NO_SUCH_PREPARED:  # someone deallocated ours
                prepared.clear()  # the next batch prepares afresh
            exc.tidings_result = owner  # type: ignore[attr-defined]
            raise exc

    def _queue(self, calls: list[tuple[Any, tuple[Any, ...]]],
               sent: list[tuple[Result | None, tuple[bytes, tuple[int, ...]] | None]],
               sql: str, params: Any, result: Result | None) -> None:
        """Convert one statement into the libpq calls that send it (a prepare first, the
        first time this connection sends it with these parameter types)."""
        pgconn = self.pgconn
        if params is None:
            calls.append((pgconn.send_query_params, (sql.encode(self.encoding), None)))
            sent.append((result, None))
            return
        tx = self._tx
        query, want, order = self._convert(sql)
        try:
            values = tx.dump_sequence([params[k] for k in order], want)
        except KeyError as missing:
            raise pg_errors.ProgrammingError(f"query parameter missing: {missing}") from None
        types = tx.types or ()
        formats = tx.formats
        key = (query, types)
        prepared = self._prepared
        name = prepared.get(key)
        if name is None and len(prepared) < MAX_PREPARED:
            name = b"_td_%d" % len(prepared)
            prepared[key] = name
            calls.append((pgconn.send_prepare, (name, query, types)))
            sent.append((None, key))
        if name is None:
            calls.append((pgconn.send_query_params, (query, values, types, formats)))
        else:
            calls.append((pgconn.send_query_prepared, (name, values, formats)))
        sent.append((result, None))

    def _flush(self) -> None:
        pgconn = self.pgconn
        while pgconn.flush():
            fd = pgconn.socket
            readable, _, _ = select.select([fd], [fd], [])
            if readable:
                pgconn.consume_input()  # take in results so the server can keep sending

    def _next(self) -> pq.abc.PGresult | None:
        pgconn = self.pgconn
        while pgconn.is_busy():
            select.select([pgconn.socket], [], [])
            pgconn.consume_input()
        res: pq.abc.PGresult | None = pgconn.get_result()
        return res


def wire_of(conn: Any) -> Wire:
    """The ``Wire`` of psycopg connection ``conn``, made on first use and kept on the
    connection itself, so it is freed with it (the wire's ``Transformer`` refers back to the
    connection: a table keyed by connections would keep every one alive)."""
    wire: Wire | None = getattr(conn, "_tidings_wire", None)
    if wire is None:
        wire = conn._tidings_wire = Wire(conn)
    return wire
