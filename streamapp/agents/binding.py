"""Which handler parameter receives which table: checked once, when an agent registers.

The rule (``App.agent`` says it to users too):

1. The handler is an ``async def`` function (or an object whose ``__call__`` is one).
2. Its first positional parameter receives the event. After it come exactly as many
   positional parameters as ``tables=[...]`` and ``reads=[...]`` list together (the
   tables first, then the tables read), one per table; or fewer and a ``*args``
   parameter, which takes the tables left over. Any other parameter is keyword-only with
   a default (it is never given), but for ``send``.
3. A table parameter receives, when
   - every listed table has a parameter of its exact name (and there is no ``*args``):
     the table of its name, whatever the order of the list (binding by name);
   - otherwise: the table at its position in the list (binding by position). A
     parameter named after a listed table must then sit at that table's position, or
     the list and the parameters are in different orders: refused.
   The event parameter must not be named after a listed table.
4. ``tables=`` and ``reads=`` are lists of Tables, each name once in both.
5. An agent with ``sinks=[...]`` takes a keyword-only parameter ``send`` (``*, send``):
   it receives the agent's :class:`~streamapp.agents.outputs.Send`. Without sinks, a
   keyword-only ``send`` is refused (there is nothing it could send to).

Table names are compared exactly; a table whose name is not a Python identifier (say
``order-status``) can only be bound by position.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import ConfigError
from ..tables.table import Table

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def bind_tables(
    agent: str,
    handler: Callable[..., Any],
    tables: Sequence[Table[Any]],
    reads: Sequence[Table[Any]] = (),
    *,
    sends: bool = False,
    blocking: bool = False,
) -> tuple[Table[Any], ...]:
    """``tables`` and ``reads`` in the order the handler's parameters take them, or
    ConfigError saying what to change (it names the agent). ``sends``: the agent declares
    sinks, so its handler must take ``send``; ``blocking``: it runs in a thread, so a
    plain ``def`` handler is allowed."""

    def refuse(why: str) -> ConfigError:
        return ConfigError(f"agent {agent!r}: {why}")

    listed = _checked_list(tables, refuse, "tables") + _checked_list(reads, refuse, "reads")
    if len({t.name for t in listed}) < len(listed):
        both = sorted({t.name for t in tables} & {t.name for t in reads})
        raise refuse(
            f"table(s) {both} are listed in tables=[...] and in reads=[...]; an agent "
            "reads its own tables through tables=[...]"
        )
    if not blocking:
        _check_async(handler, refuse)
    elif not callable(handler):
        raise refuse(f"the handler {handler!r} is not a function; decorate a `def`")
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError):  # no signature to read (a C callable): by position
        if sends:
            raise refuse("its handler has no signature to read: it cannot take `send`") from None
        return listed
    params = list(signature.parameters.values())
    shown = f"{_name(handler)}{signature}"
    _check_send(params, shown, sends, refuse)
    star = next((p for p in params if p.kind is inspect.Parameter.VAR_POSITIONAL), None)
    positional = [p for p in params if p.kind in _POSITIONAL]
    never_given = [
        p.name
        for p in params
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is p.empty and p.name != "send"
    ]
    if never_given:
        raise refuse(
            f"handler {shown}: keyword-only parameter(s) {', '.join(never_given)} are never "
            "given; give them a default or remove them"
        )
    if not positional and star is None:
        raise refuse(f"handler {shown} takes no parameter for the event; write `(event, ...)`")
    names = [t.name for t in listed]
    if positional and positional[0].name in names:
        raise refuse(
            f"handler {shown}: its first parameter {positional[0].name!r} receives the event, "
            f"but it is named after table {positional[0].name!r}; the event comes first, "
            "then one parameter per table"
        )
    table_params = [p.name for p in positional[1:]]
    if len(table_params) > len(listed) or (star is None and len(table_params) < len(listed)):
        raise refuse(
            f"handler {shown} takes {len(table_params)} table parameter(s) after the event, "
            f"but {_lists(tables, reads)} {len(listed)}; give the handler one "
            "parameter per listed table (named after it, or in list order), or list one "
            "table per parameter"
        )
    if star is None and listed and sorted(table_params) == sorted(names):
        by_name = {t.name: t for t in listed}
        return tuple(by_name[p] for p in table_params)  # binding by name
    for position, param in enumerate(table_params):
        if param in names and names[position] != param:
            raise refuse(
                f"handler {shown}: parameter {param!r} is named after table {param!r} but "
                f"sits where {_lists(tables, reads)} {names[position]!r}, so it "
                f"would receive table {names[position]!r}. List the tables in parameter "
                "order, or name every table parameter after its table"
            )
    return listed  # binding by position


def _lists(tables: Sequence[Table[Any]], reads: Sequence[Table[Any]]) -> str:
    shown = f"tables=[{', '.join(t.name for t in tables)}]"
    if reads:
        shown += f" and reads=[{', '.join(t.name for t in reads)}]"
    return shown + (" list" if reads else " lists")


def _check_send(
    params: list[inspect.Parameter],
    shown: str,
    sends: bool,
    refuse: Callable[[str], ConfigError],
) -> None:
    send = next((p for p in params if p.name == "send"), None)
    keyword_only = send is not None and send.kind is inspect.Parameter.KEYWORD_ONLY
    if sends and send is None:
        raise refuse(
            f"it declares sinks=[...] but handler {shown} takes no `send`; add a keyword-only "
            "parameter: `async def handler(event, ..., *, send: Send)`"
        )
    if sends and not keyword_only:
        raise refuse(
            f"handler {shown}: `send` must be keyword-only, after the tables: "
            "`async def handler(event, ..., *, send: Send)`"
        )
    if not sends and keyword_only:
        raise refuse(
            f"handler {shown} takes `send` but the agent declares no sinks=[...]; list the "
            "topics it sends to: @app.agent(topic, sinks=[app.topic(...)])"
        )


def _checked_list(
    tables: Sequence[Table[Any]], refuse: Callable[[str], ConfigError], what: str
) -> tuple[Table[Any], ...]:
    if isinstance(tables, (Table, str)):
        raise refuse(f"{what}= takes a list of tables: {what}=[{tables!r}]")
    listed = tuple(tables)
    seen: set[str] = set()
    for table in listed:
        if not isinstance(table, Table):
            raise refuse(f"{what}=[...] holds {table!r}, not a Table; declare it as Table(name)")
        if table.name in seen:
            raise refuse(f"table {table.name!r} is listed twice in {what}=[...]")
        seen.add(table.name)
    return listed


def _check_async(handler: Any, refuse: Callable[[str], ConfigError]) -> None:
    if inspect.iscoroutinefunction(handler):
        return
    call = getattr(type(handler), "__call__", None)  # noqa: B004 (the class's, not the object's)
    if not inspect.isroutine(handler) and inspect.iscoroutinefunction(call):
        return  # an object with ``async def __call__``
    if not callable(handler):
        raise refuse(f"the handler {handler!r} is not a function; decorate an `async def`")
    name = _name(handler)
    if inspect.isasyncgenfunction(handler):
        raise refuse(
            f"handler {name} is an async generator (it yields); a handler returns nothing: "
            "remove the yield"
        )
    # A plain def is not run in a thread silently: that changes where the user's code
    # runs (its globals and clients are then touched from another thread) and costs a
    # thread hop per event, so it is asked for by name.
    raise refuse(
        f"handler {name} is not an async function; declare it `async def {name}(event, ...)` "
        "(streamapp awaits it for every event on the event loop), or, for a handler that "
        "blocks (CPU-heavy work, a blocking client library), keep the `def` and register it "
        "with @app.agent(..., blocking=True): it then runs in a thread of its partition "
        "(docs/concepts.md: Blocking handlers)"
    )


def _name(handler: Any) -> str:
    return str(getattr(handler, "__name__", None) or type(handler).__name__)
