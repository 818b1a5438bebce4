"""The hot statements, run on the driver's connection past SQLAlchemy's execution layer.

A step's claim and commit and a producer's new run are a handful of prebuilt statements, run for
every step. Through `Connection.execute` each paid for SQLAlchemy's work around the driver call:
the compiled-cache lookup, an execution context, the parameters processed, a result object and its
metadata read from the cursor's description (on psycopg a Python object per column: the claim
returns 31). A claim cost 1.28 ms that way and 0.59 ms on the same pool's connection through the
driver, measured interleaved on PostgreSQL (SQLite: 0.57 and 0.28 ms; bench/FINDINGS.md).

`Direct` compiles its statement once for the engine's dialect and then does only what the driver
needs: the parameters in the compiled order, the driver's `execute` (or `executemany`), and rows
read by position into a named tuple. Everything else is kept as SQLAlchemy does it:

- the transaction: it runs on the caller's `Connection`, beginning it as SQLAlchemy's autobegin
  would, so `engine.begin()`, the SQLite `BEGIN IMMEDIATE` hook and the commit listeners apply;
- errors: a driver error is raised as SQLAlchemy's wrapped error (`IntegrityError`,
  `OperationalError`...), and a dropped connection, or an exit (`SystemExit`) in the middle of the
  statement, invalidates the connection as `Connection.execute` would (`orchestrator.store.transient`
  reads both);
- what watches statements: where a `before_cursor_execute`, `after_cursor_execute` or
  `handle_error` listener is set on the engine (an OpenTelemetry instrumentation, a test's fault),
  the statement goes through `Connection.execute` as before, so the listener gets the execution
  context it expects. SQLAlchemy's `echo` log does not show direct statements.

Only statements whose values the driver takes as they are may be direct: `Direct` refuses, when
built, a statement with a parameter or result column the dialect would convert (SQLite's
Booleans are the one exception, read back as `bool`), and the tests compare every direct
statement's rows with SQLAlchemy's on both databases (tests/integration/test_direct.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import suppress
from typing import Any, cast

from sqlalchemy import ARRAY, Boolean, Connection, Float, Integer, String
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ClauseElement


class DirectRow(tuple):  # type: ignore[type-arg]
    """A row read by `Direct`: its columns by name (`row.run_id`) and as `_mapping`, like a
    SQLAlchemy `Row` as far as `RunRecord.from_row` and the store read it."""

    __slots__ = ()
    _fields: tuple[str, ...]

    @property
    def _mapping(self) -> dict[str, Any]:
        return dict(zip(self._fields, self, strict=True))

    def __getattr__(self, name: str) -> Any:  # reached only for a name that is not a column
        raise AttributeError(f"the row has no column {name!r} (its columns: {', '.join(self._fields)})")


class Direct:
    """One statement compiled for one dialect, run through the driver (see the module docstring)."""

    def __init__(self, statement: Executable, dialect: Dialect) -> None:
        compiled = cast(ClauseElement, statement).compile(dialect=dialect)
        assert isinstance(compiled, SQLCompiler)
        if compiled.escaped_bind_names or "POSTCOMPILE" in compiled.string:
            raise ValueError(f"not a direct statement (escaped or expanding parameters): {compiled.string[:80]}")
        self.statement = statement
        self.sql = compiled.string
        self._positions = tuple(compiled.positiontup or ()) if compiled.positional else None
        binds = [(name, b) for b, name in compiled.bind_names.items()]  # by the names the SQL uses (`param_1`)
        #: The statement's own literal values (`status = 'QUEUED'`), bound with every call.
        self._fixed = {name: b.effective_value for name, b in binds if not b.required and b.callable is None}
        converted = [name for name, b in binds if not _bound_as_is(b.type, dialect)]
        if converted:
            raise ValueError(f"parameters {converted} would be converted by SQLAlchemy; run the statement through it")
        columns = [(c[0], c[3]) for c in getattr(compiled, "_result_columns", ())]
        self._booleans = tuple(i for i, (_, type_) in enumerate(columns) if _is_boolean(type_, dialect))
        for name, type_ in columns:
            if not _is_boolean(type_, dialect) and _converts(type_, dialect):
                raise ValueError(f"column {name} would be converted by SQLAlchemy; run the statement through it")
        self.returns_rows = bool(columns)
        self._row = type("Row", (DirectRow,), {"_fields": tuple(name for name, _ in columns), "__slots__": ()})
        for i, (name, _) in enumerate(columns):  # attribute access by name, as namedtuple does it
            setattr(self._row, name, _column(i))

    def rows(self, conn: Connection, params: Mapping[str, Any]) -> list[Any]:
        """Run with `params` on `conn` (in its transaction); the rows it returns (`DirectRow`s,
        or SQLAlchemy's rows where a listener watches the engine)."""
        if _watched(conn):
            result = conn.execute(self.statement, params)
            return list(result) if result.returns_rows else []
        return self._run(conn, self._bind(params), many=False)

    def first(self, conn: Connection, params: Mapping[str, Any]) -> Any:
        """Run with `params`; its first row, or None."""
        rows = self.rows(conn, params)
        return rows[0] if rows else None

    def many(self, conn: Connection, params: Sequence[Mapping[str, Any]]) -> None:
        """Run once for each of `params` (the driver's `executemany`): for inserts."""
        if not params:
            return
        if _watched(conn):
            conn.execute(self.statement, list(params))
        else:
            self._run(conn, [self._bind(p) for p in params], many=True)

    def _bind(self, params: Mapping[str, Any]) -> Any:
        values = {**self._fixed, **params}
        if self._positions is None:
            return values
        return tuple(values[name] for name in self._positions)

    def _run(self, conn: Connection, parameters: Any, *, many: bool) -> list[DirectRow]:
        if not conn.in_transaction():
            conn.begin()  # what SQLAlchemy's autobegin does on a first execute
        dbapi = conn.connection.dbapi_connection
        assert dbapi is not None
        cursor = dbapi.cursor()
        try:
            if many:
                cursor.executemany(self.sql, parameters)
            else:
                cursor.execute(self.sql, parameters)
            rows = cursor.fetchall() if self.returns_rows and not many else []
            cursor.close()
        except BaseException as exc:
            failure = self._failed(conn, dbapi, cursor, exc, parameters, many=many)
            if not conn.invalidated:
                with suppress(Exception):  # a cursor that cannot close must not hide the statement's error
                    cursor.close()
            raise failure from None
        if self._booleans:
            rows = [_with_booleans(r, self._booleans) for r in rows]
        return [self._row(r) for r in rows]

    def _failed(
        self, conn: Connection, dbapi: Any, cursor: Any, exc: BaseException, parameters: Any, *, many: bool
    ) -> BaseException:
        """What `Connection.execute` raises for `exc`, with the connection invalidated where it
        would be: a dropped connection, or an exit in the middle of the statement. The engine's
        `hide_parameters` holds as it does there: the bound values (messages, tool results) stay
        out of the error's text, and so out of the logs that print it."""
        dialect = conn.dialect
        driver_error = dialect.loaded_dbapi.Error
        if not isinstance(exc, driver_error):
            if not isinstance(exc, Exception):  # SystemExit, KeyboardInterrupt: the state is unknown
                conn.invalidate(exc)
            return exc
        dropped = dialect.is_disconnect(exc, dbapi, cursor)
        wrapped = DBAPIError.instance(
            self.sql,
            parameters,
            exc,
            driver_error,
            hide_parameters=conn.engine.hide_parameters,
            connection_invalidated=dropped,
            dialect=dialect,
            ismulti=many,
        )
        if dropped:
            # As `Connection.execute` does: every connection the pool opened before this one is
            # recycled on its next checkout (a restart or a failover dropped them all), so a
            # retry does not take the next dead one.
            conn.engine.pool._invalidate(conn.connection, exc)
            conn.invalidate(exc)
        wrapped.__cause__ = exc
        return wrapped


#: The types whose bind processors, where a dialect has one, pass Python's own values through.
_PLAIN = (Float, Integer, String, Boolean)


def _bound_as_is(type_: Any, dialect: Dialect) -> bool:
    """Whether the driver takes a value of `type_` as SQLAlchemy would pass it: no processor, or
    one that leaves Python's own numbers, strings and Booleans alone (and arrays of them)."""
    if type_._cached_bind_processor(dialect) is None:
        return True
    if isinstance(type_, ARRAY):
        return isinstance(type_.item_type, _PLAIN)
    return isinstance(type_, _PLAIN)


def _watched(conn: Connection) -> bool:
    """Whether a listener watches the statements `conn` runs (see the module docstring)."""
    dispatch = conn.dispatch
    return bool(dispatch.before_cursor_execute or dispatch.after_cursor_execute or conn.dialect.dispatch.handle_error)


def _column(i: int) -> property:
    return property(lambda row: row[i])


def _is_boolean(type_: Any, dialect: Dialect) -> bool:
    """A Boolean column the dialect converts (SQLite's, stored as 0 and 1): read back as `bool`."""
    return isinstance(type_, Boolean) and _converts(type_, dialect)


def _converts(type_: Any, dialect: Dialect) -> bool:
    try:
        return type_._cached_result_processor(dialect, None) is not None
    except Exception:  # a processor chosen by the driver's type code (PostgreSQL's floats): none for ours
        return False


def _with_booleans(row: tuple[Any, ...], positions: tuple[int, ...]) -> tuple[Any, ...]:
    values = list(row)
    for i in positions:
        if values[i] is not None:
            values[i] = bool(values[i])
    return tuple(values)


_compiled: dict[tuple[int, type[Dialect]], Direct] = {}


def of(statement: Executable, dialect: Dialect) -> Direct:
    """`statement` compiled for `dialect`, once per process. For the module-level statements of
    `orchestrator.store.statements` only: they are kept by their identity, and live as long as
    the process."""
    key = (id(statement), type(dialect))
    found = _compiled.get(key)
    if found is None:
        found = _compiled[key] = Direct(statement, dialect)
    return found


def rows(conn: Connection, statement: Executable, params: Mapping[str, Any]) -> list[Any]:
    """Run the prebuilt `statement` through the driver on `conn`; its rows."""
    return of(statement, conn.dialect).rows(conn, params)


def first(conn: Connection, statement: Executable, params: Mapping[str, Any]) -> Any:
    """Run the prebuilt `statement` through the driver on `conn`; its first row, or None."""
    return of(statement, conn.dialect).first(conn, params)


def many(conn: Connection, statement: Executable, params: Sequence[Mapping[str, Any]]) -> None:
    """Run the prebuilt `statement` through the driver once for each of `params`."""
    of(statement, conn.dialect).many(conn, params)
