"""Named plug-ins: engine kinds (`[engine] kind`) and probes (`[schedule] probes`).

Built-in names map to "module:Class" strings, so choosing one imports only its module; third parties add
names through an entry-point group, as lm-eval's registry and llm's plugins do:

    [project.entry-points."evalgate.probes"]
    my-probe = "my_package.probes:MyProbe"
"""

from __future__ import annotations

import importlib
from importlib import metadata


class Registry:
    """Names -> classes: the built-in ones first, then those of installed plugins (a plugin never shadows
    a built-in name)."""

    def __init__(self, group: str, builtin: dict[str, str]):
        self.group = group
        self.builtin = builtin

    def targets(self) -> dict[str, str]:
        """Every known name -> "module:Class"."""
        targets = dict(self.builtin)
        for entry in metadata.entry_points(group=self.group):
            targets.setdefault(entry.name, entry.value)
        return targets

    def names(self) -> tuple[str, ...]:
        return tuple(self.targets())

    def load(self, name: str) -> type | None:
        """The class registered as `name`, or None when nothing of that name is known."""
        # a built-in name needs no scan of every installed distribution's entry points
        target = self.builtin.get(name) or self.targets().get(name)
        if target is None:
            return None
        module, _, attribute = target.partition(":")
        return getattr(importlib.import_module(module), attribute)
