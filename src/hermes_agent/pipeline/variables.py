"""Per-run variables: request data that hooks, prompt placeholders and the trail can see.

``Agent.run(..., variables={"lang": "zh", "tier": "gold"})``, ``variables`` on ``POST /v1/runs``
and on a WebSocket ``run`` message, ``metadata`` on the OpenAI facade. They are the start of the
run's ``ctx.variables`` (hooks read them and add their own), fill ``{{ lang }}`` in the system
prompt, and are recorded in the trail at the InputParser (role ``variables``, redacted like
every record) and returned in ``RunResult.variables``.

They are request data, so they are bounded: names are identifiers (they must be usable as
placeholders), values are JSON (strings, numbers, booleans, null, lists and objects), nested at
most ``MAX_DEPTH`` deep, at most ``MAX_VARIABLES`` of them and ``MAX_VARIABLES_CHARS`` of JSON
in all. The service checks them in the run layer's gate (413 when too big, 422 otherwise),
the library when a run starts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from hermes_agent.errors import HermesAgentError

MAX_VARIABLES = 64
MAX_VARIABLES_CHARS = 16_000
MAX_DEPTH = 4
MAX_NAME_CHARS = 64
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class VariablesTooLarge(HermesAgentError, ValueError):
    """The variables' JSON is over ``MAX_VARIABLES_CHARS`` (the service answers 413)."""


def variables_problem(variables: object, *, max_chars: int = MAX_VARIABLES_CHARS) -> str | None:
    """What is wrong with ``variables``, their size included (``None``: nothing)."""
    try:
        check_variables(variables, max_chars=max_chars)
    except ValueError as exc:
        return str(exc)
    return None


def check_variables(variables: object, *, max_chars: int = MAX_VARIABLES_CHARS) -> dict[str, Any]:
    """The variables as a plain dict; ``ValueError`` saying what is wrong, or
    ``VariablesTooLarge`` when their JSON is over ``max_chars``."""
    if not isinstance(variables, Mapping):
        raise ValueError(
            f"variables must be a mapping of name to value, got {type(variables).__name__}"
        )
    if len(variables) > MAX_VARIABLES:
        raise ValueError(f"{len(variables)} variables; at most {MAX_VARIABLES} are accepted")
    for name, value in variables.items():
        if not isinstance(name, str) or len(name) > MAX_NAME_CHARS or not NAME.fullmatch(name):
            raise ValueError(
                f"variable name {str(name)[:MAX_NAME_CHARS]!r}: use letters, digits and _, "
                f"not starting with a digit, at most {MAX_NAME_CHARS} characters (it must "
                "work as a {{ placeholder }})"
            )
        _check_value(name, value, 1)
    size = len(json.dumps(dict(variables), ensure_ascii=False))
    if size > max_chars:
        raise VariablesTooLarge(
            f"the variables are {size:,} characters of JSON; at most {max_chars:,} are "
            "accepted: send less, or let a hook or a tool fetch the data"
        )
    return dict(variables)


def _check_value(name: str, value: object, depth: int) -> None:
    if value is None or isinstance(value, str | bool | int):
        return
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"variable {name!r}: {value!r} is not a JSON number")
        return
    if depth >= MAX_DEPTH and isinstance(value, list | tuple | Mapping):
        raise ValueError(f"variable {name!r} is nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, list | tuple):
        for item in value:
            _check_value(name, item, depth + 1)
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"variable {name!r}: object keys must be strings")
            _check_value(name, item, depth + 1)
        return
    raise ValueError(
        f"variable {name!r}: a {type(value).__name__} is not a JSON value (use strings, "
        "numbers, booleans, null, lists and objects)"
    )
