"""ferrio's process-wide settings, by the names of their ``FERRIO_*`` variables.

Every setting has a name (``task_size``) and an environment variable (``FERRIO_TASK_SIZE``);
either is accepted here. Values are ints, bools or strings in the forms the variables take:

>>> import ferrio
>>> ferrio.config.get("task_size")
4194304
>>> with ferrio.config.set(task_size="1MiB", direct_read="off"):   # doctest: +SKIP
...     ...                                  # files opened here use 1 MiB tasks
>>> ferrio.config.get("task_size")           # restored on exit
4194304

A file takes a snapshot of the settings when it is opened: changing them never affects files
already open or I/O under way, with one exception. The worker pool of a device serves every file
on it and takes the size (``max_threads``, ``threads_per_device``, ``device_threads``) of the
latest file opened there, so opening a file with other sizes resizes the pool of the files
already open, until the next open. The settings are shared by all threads of the process, and a
``with set(...)`` block puts back the values it found on entry: blocks of several threads that
overlap without nesting (the first one entered exits first) leave the values of the other in
force afterwards. Change settings from one thread, around the work of all threads.
"""

from __future__ import annotations

import types
from typing import NamedTuple, SupportsIndex

from ferrio import _native

Value = int | bool | str
"""A setting's value: int for sizes and counts, bool for on/off, str for the rest."""

Given = Value | SupportsIndex
"""A value `set` takes: a `Value`, or another integer type (numpy's `np.int64(4096)`)."""


class SettingInfo(NamedTuple):
    """Describes one setting."""

    name: str
    """The name used by `get` and `set`, such as ``task_size``."""
    env: str
    """The environment variable, such as ``FERRIO_TASK_SIZE``."""
    unit: str
    """Unit or kind of value."""
    doc: str
    """What the setting does."""
    default: str
    """The default, in the form the variable takes (``"4 MiB"``, ``"auto"``; empty for none)."""


def get(name: str) -> Value:
    """Return the value of one setting, by name or ``FERRIO_*`` variable.

    Raises ValueError for an unknown name (the message lists every setting).
    """
    return _native.config_get(name)


def settings() -> dict[str, Value]:
    """Return every setting by name."""
    return _native.config_settings()


def describe() -> list[SettingInfo]:
    """Return the name, variable, unit, description and default of every setting."""
    return [SettingInfo(*row) for row in _native.config_describe()]


def _settings_help() -> str:
    """Return the list of settings for this module's docstring, from the native table."""
    lines = ["", "The settings (name, variable, default: what it does):", ""]
    for info in describe():
        default = info.default or "empty"
        lines.append(f"- ``{info.name}`` (``{info.env}``, default ``{default}``): {info.doc}.")
    return "\n".join(lines) + "\n"


__doc__ = (__doc__ or "") + _settings_help()


def environment_error() -> str | None:
    """Return the error found in the ``FERRIO_*`` environment at start-up, or None.

    When a variable holds a bad value, ferrio starts with its defaults instead.
    """
    return _native.env_error()


def environment_warnings() -> list[str]:
    """Return one line per ``FERRIO_*`` variable that names no setting (a misspelt name, say).

    ferrio ignores such variables; each line names the setting variable nearest to it where one
    is near (``did you mean FERRIO_THREADS_PER_DEVICE?``). Importing ferrio warns of each.
    """
    return _native.env_warnings()


class _Change:
    """Settings just changed by `set`; restores the previous values when used with ``with``."""

    def __init__(self, previous: dict[str, Value]) -> None:
        self._previous = previous

    def __enter__(self) -> _Change:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        self.restore()

    def restore(self) -> None:
        """Put back the values the settings had before `set`."""
        _native.config_set(list(self._previous.items()))

    def __repr__(self) -> str:
        return f"<ferrio.config.set, previous values {self._previous!r}>"


def set(**values: Given) -> _Change:
    """Change settings for the whole process, all or none, effective at once.

    Names are setting names or their ``FERRIO_*`` variables; values are ints, bools or strings
    in the forms the variables take (``task_size=4194304`` or ``task_size="4MiB"``,
    ``direct_read="auto"``, ``direct_overread=True``). A bad name or value raises ValueError
    naming the setting, the value and the accepted forms, and changes nothing.

    Used as a context manager, the previous values come back on exit::

        with ferrio.config.set(task_size="1MiB"):
            ...

    The values are the whole process's, not the thread's: see the module's notes on threads.
    """
    return _Change(_native.config_set(list(values.items())))
