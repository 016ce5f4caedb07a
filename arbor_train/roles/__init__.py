"""Roles: one file each (litgpt style). `arbor_train/roles/<name>.py` holds a role's builder, its
LightningModule, its baseline rows and its finalize/export extras, and defines `ROLE`, an instance of
`roles.common.Role`. train.py, export.py and the pipeline dispatch through this registry only: a task
YAML's `role: <name>` picks the file.

Adding a role = adding `arbor_train/roles/<name>.py` (a `Role` subclass and `ROLE = ...`) and one
`conf/task/<task>.yaml` with `role: <name>` (the README's "Adding a role" lists the steps).
"""

from __future__ import annotations

import importlib
import pkgutil

from ..errors import ConfigError
from .common import Built, Role, RoleModule

__all__ = ["Built", "Role", "RoleModule", "get"]


def get(name: str) -> Role:
    """The role named by a task config's `role` (arbor_train/roles/<name>.py)."""
    known = [m.name for m in pkgutil.iter_modules(__path__) if m.name != "common"]
    if name not in known:
        raise ConfigError(f"option task.role={name!r}: no such role (arbor_train/roles/ has {', '.join(sorted(known))})")
    role = getattr(importlib.import_module(f"{__name__}.{name}"), "ROLE", None)
    if not isinstance(role, Role):
        raise ConfigError(f"arbor_train/roles/{name}.py defines no ROLE (a roles.common.Role instance)")
    return role
