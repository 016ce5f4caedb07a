"""Errors a user's configuration or input causes, and the entry-point wrapper that reports them.

A user's mistake (an option that cannot work, a malformed input file) is a `UserError`: every entry
point prints `error: <message>` on stderr and exits 2, with no traceback. Anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

EXIT_USER_ERROR = 2


class UserError(ValueError):
    """A mistake in what the user asked for; the message names the file, record, field or option."""


class ConfigError(UserError):
    """An option, or a combination of options, that cannot work; the message names the option."""


class InputError(UserError):
    """An input file or record that cannot be used; the message names the file, record and field."""


def entry_point(fn: F) -> F:
    """Wrap a command's main body: a UserError becomes `error: ...` on stderr and exit status 2.

    Put it under `@hydra.main` so Hydra's own argument errors keep Hydra's handling.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            sys.stdout.flush()
            print(f"error: {e}", file=sys.stderr)
            sys.exit(EXIT_USER_ERROR)

    return wrapper  # type: ignore[return-value]


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def unencodable(value: str) -> UnicodeEncodeError | None:
    """Why `value` cannot be stored as UTF-8 text (a lone UTF-16 surrogate, e.g. a JSON \\ud800 escape
    without its pair), or None if it can. Callers word the error for their own file and field."""
    if value.isascii():
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        return e
    return None


def parse_bool(value: Any, option: str) -> bool:
    """A boolean option read strictly: true/false (also yes/no, on/off, 1/0); anything else is refused."""
    if isinstance(value, bool):
        return value
    if value is None:
        return False
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ConfigError(f"option {option} must be true or false, got {value!r}")


def parse_int(value: Any, option: str, minimum: int | None = None) -> int:
    """An integer option read strictly (no floats, no booleans), optionally with a lower bound."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"option {option} must be an integer, got {value!r}")
    try:
        out = int(value)
    except ValueError as e:
        raise ConfigError(f"option {option} must be an integer, got {value!r}") from e
    if minimum is not None and out < minimum:
        raise ConfigError(f"option {option} must be at least {minimum}, got {out}")
    return out


def parse_float(value: Any, option: str, minimum: float | None = None, exclusive: bool = False) -> float:
    """A number option read strictly (no booleans), optionally with a lower bound."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"option {option} must be a number, got {value!r}")
    try:
        out = float(value)
    except ValueError as e:
        raise ConfigError(f"option {option} must be a number, got {value!r}") from e
    if out != out or out in (float("inf"), float("-inf")):
        raise ConfigError(f"option {option} must be a finite number, got {value!r}")
    if minimum is not None and (out <= minimum if exclusive else out < minimum):
        raise ConfigError(f"option {option} must be {'above' if exclusive else 'at least'} {minimum}, got {out}")
    return out


# ---------------------------------------------------------------------- additive helpers
class OutputExistsError(ConfigError, FileExistsError):
    """An output folder exists and overwrite is off (still a FileExistsError for callers that catch it)."""


class MissingInputError(InputError, FileNotFoundError):
    """A file or folder an option names does not exist (still a FileNotFoundError)."""


def parse_choice(value: Any, option: str, choices: Any) -> Any:
    """An option that must be one of `choices` (compared as given: no str/int coercion, no booleans)."""
    valid = list(choices)
    if isinstance(value, bool) or value not in valid:
        raise ConfigError(f"option {option} must be one of {', '.join(str(c) for c in valid)}; got {value!r}")
    return value


def conf_options(group: str) -> list[str]:
    """The options of a config group: the stems of conf/<group>/*.yaml, sorted."""
    from .paths import CONF_DIR

    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
