"""What a run's fingerprint says about its LoRA adapters (the `suite` component's `adapters` section,
configuration/suite.py `Suite.identity`): which adapter each request ran under, and whether a request's
change from the baseline is its adapter's (files or name) or its own text and sampling, or both.
"""

from __future__ import annotations


def _section(fingerprint: dict) -> dict:
    return ((fingerprint.get("suite") or {}).get("data") or {}).get("adapters") or {}


def request_adapters(fingerprint: dict) -> dict[str, str]:
    """Request key -> the adapter it ran under (requests of the base model are absent)."""
    return {key: entry["adapter"] for key, entry in (_section(fingerprint).get("requests") or {}).items()}


def _parts(fingerprint: dict, key: str) -> tuple[str | None, dict | None, str | None]:
    """A request's (adapter name, adapter files, own hash); the own hash of a request without an adapter is
    its request hash."""
    section = _section(fingerprint)
    entry = (section.get("requests") or {}).get(key)
    if entry is None:
        own = (((fingerprint.get("suite") or {}).get("data") or {}).get("requests") or {}).get(key)
        return None, None, own
    return entry["adapter"], (section.get("files") or {}).get(entry["adapter"]), entry.get("own")


def request_change(baseline: dict, current: dict, key: str) -> list[str]:
    """Why a request's hash moved: "adapter" (it runs under another adapter, or its adapter's files changed),
    "suite" (its own text or sampling changed), or both."""
    name_a, files_a, own_a = _parts(baseline, key)
    name_b, files_b, own_b = _parts(current, key)
    moved = []
    if own_a != own_b:
        moved.append("suite")
    if (name_a, files_a) != (name_b, files_b):
        moved.append("adapter")
    return moved or ["suite"]


def describe_adapters(baseline: dict, current: dict) -> str | None:
    """`support: files changed: adapter_model.safetensors; legal: new` for the adapters that differ between
    two runs (None: none differ)."""
    old, new = _section(baseline).get("files") or {}, _section(current).get("files") or {}
    parts = []
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if a == b:
            continue
        if a is None or b is None:
            parts.append(f"{name}: {'new' if a is None else 'gone'}")
            continue
        files = sorted(f for f in set(a) | set(b) if a.get(f) != b.get(f))
        parts.append(f"{name}: files changed: {', '.join(files[:8])}{' ...' if len(files) > 8 else ''}")
    return "; ".join(parts) or None
