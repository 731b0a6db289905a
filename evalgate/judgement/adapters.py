"""What two runs' fingerprints say about their LoRA adapters (the `suite` component's `adapters` section,
configuration/suite.py `Suite.identity`, read through `RunFingerprint`): whether a request's change from the
baseline is its adapter's (files or name) or its own text and sampling, or both.
"""

from __future__ import annotations

from ..fingerprint import RunFingerprint


def _parts(fingerprint: RunFingerprint, key: str) -> tuple[str | None, dict | None, str | None]:
    """A request's (adapter name, adapter files, own hash)."""
    adapter = fingerprint.request_adapters.get(key)
    return adapter, fingerprint.adapter_files.get(adapter) if adapter else None, fingerprint.own_hash(key)


def request_change(baseline: RunFingerprint, current: RunFingerprint, key: str) -> list[str]:
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


def describe_adapters(baseline: RunFingerprint, current: RunFingerprint) -> str | None:
    """`support: files changed: adapter_model.safetensors; legal: new` for the adapters that differ between
    two runs (None: none differ)."""
    old, new = baseline.adapter_files, current.adapter_files
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
