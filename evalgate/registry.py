"""Named plug-ins: engine kinds (`[engine] kind`) and probes (`[schedule] probes`).

Both name tables live here, on the ground floor, so that what reads a suite can name a plug-in without
importing the package that holds it. Built-in names map to "module:Class" strings, so choosing one imports
only its module; third parties add names through an entry-point group, as lm-eval's registry and llm's
plugins do:

    [project.entry-points."evalgate.probes"]
    my-probe = "my_package.probes:MyProbe"
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from importlib import metadata, util

from .errors import ConfigError


class Registry:
    """Names -> classes: the built-in ones first, then those of installed plugins (a plugin never shadows
    a built-in name). `what` names the thing in messages; `base` ("module:Class") is the class every entry
    must subclass."""

    def __init__(self, group: str, builtin: dict[str, str], *, what: str, base: str):
        self.group, self.builtin, self.what, self.base = group, builtin, what, base

    def targets(self) -> dict[str, str]:
        """Every known name -> "module:Class"."""
        targets = dict(self.builtin)
        for entry in metadata.entry_points(group=self.group):
            targets.setdefault(entry.name, entry.value)
        return targets

    def names(self) -> tuple[str, ...]:
        return tuple(self.targets())

    def __contains__(self, name: str | None) -> bool:
        # no name (a pass of no probe) is nothing, without scanning every installed distribution's entry points
        return bool(name) and (name in self.builtin or name in self.targets())

    def unknown(self, name: str) -> str:
        """The one message for a name nothing is registered as: the closest name, and every name."""
        names = self.names()
        close = difflib.get_close_matches(name, names, n=1)
        return (f"{'did you mean ' + repr(close[0]) + '? ' if close else ''}available {self.what}s: "
                f"{', '.join(names)} (plug-ins add more through the {self.group!r} entry points)")

    def load(self, name: str) -> type:
        """The class registered as `name`. An unknown name, or an entry that is not a subclass of `base`,
        is a ConfigError saying so (callers prefix where the name was written)."""
        # a built-in name needs no scan of every installed distribution's entry points
        target = self.builtin.get(name) or self.targets().get(name)
        if target is None:
            raise ConfigError(f"unknown {self.what} {name!r}", fix=self.unknown(name))
        found, base = _resolve(target), _resolve(self.base)
        if not (isinstance(found, type) and issubclass(found, base)):
            raise ConfigError(f"{self.what} {name!r} ({target}) is not a subclass of {self.base}",
                              fix=f"register a {base.__name__} subclass under {self.group!r}")
        return found


def _resolve(target: str):
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def _probe_modules() -> dict[str, str]:
    """One probe per module of evalgate/probes/ (base.py is not one), found without importing the package."""
    spec = util.find_spec("evalgate.probes")
    locations = list(spec.submodule_search_locations or []) if spec else []
    return {m.name: f"evalgate.probes.{m.name}:PROBE" for m in pkgutil.iter_modules(locations) if m.name != "base"}


ENGINES = Registry("evalgate.engines", {
    "vllm": "evalgate.engines.vllm_offline:VllmOfflineEngine",
    "openai": "evalgate.engines.openai_api:OpenAIEngine",
    "vllm-server": "evalgate.engines.vllm_server:VllmServerEngine",
    # A test engine (docs/design.md, "The fake engine"): deterministic outputs without a model runtime.
    "fake": "evalgate.engines.fake:FakeEngine",
}, what="engine kind", base="evalgate.engines.base:Engine")
PROBES = Registry("evalgate.probes", _probe_modules(), what="probe", base="evalgate.probes.base:Probe")
# vLLM's determinism scenarios, in the order their passes are planned (own engines last in any case)
PROBE_PRESETS = {"vllm": ("batch_edges", "needle", "adapter_mix", "prefix_cache", "prefill_decode", "chunked_prefill",
                          "preemption")}
