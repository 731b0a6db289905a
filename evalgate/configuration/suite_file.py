"""The suite file on disk: its names, the one place a command finds it (`find_suite`), and the edits evalgate
makes to it (`add_engine_settings`), with a round-trip TOML library (tomlkit), so a user's comments, order
and layout stay as they wrote them."""

from __future__ import annotations

from pathlib import Path

from ..atomic import write_text_atomic
from ..errors import ConfigError
from .config import BOM, without_bom

SUITE_FILE = "evalgate.toml"  # the default suite file, in the working directory
PYPROJECT = "pyproject.toml"  # a suite may live in its [tool.evalgate] table instead


def holds_suite(path: Path) -> bool:
    """Whether a file is a suite file: an evalgate.toml (any name but pyproject.toml), or a pyproject.toml with
    a [tool.evalgate] table."""
    return path.is_file() and (path.name != PYPROJECT or "[tool.evalgate" in path.read_text(errors="replace"))


def find_suite(path: str | Path | None = None, *, required: bool = True) -> Path | None:
    """The suite file to use: the given path, else evalgate.toml, else pyproject.toml with [tool.evalgate], in the
    working directory or, inside a git repository, the nearest directory above it up to the repository's root (as
    pre-commit finds its own; outside a repository only the working directory, so a stray file above it is never
    taken). None when none is found and not `required`."""
    if path is not None:
        return Path(path)
    here = Path.cwd()
    root = next((d for d in (here, *here.parents) if (d / ".git").exists()), here)
    for directory in (here, *here.parents):
        for name in (SUITE_FILE, PYPROJECT):
            candidate = directory / name
            if holds_suite(candidate):
                return Path(name) if directory == here else candidate
        if directory == root:
            break
    if not required:
        return None
    raise ConfigError(f"no suite file given and none found ({SUITE_FILE} or [tool.evalgate] in {PYPROJECT}, here or "
                      "above up to the repository's root)", fix="pass the suite file: evalgate check path/to/suite.toml")


def add_engine_settings(path: Path, settings: dict, why: str) -> None:
    """Set `settings` in the suite's [engine] table (in a pyproject.toml, [tool.evalgate.engine]) with a
    comment saying why: new keys at the table's end, a key already there set in place. Everything else in the
    file is kept as written."""
    import tomlkit

    written = path.read_text(encoding="utf-8")
    document = tomlkit.parse(without_bom(written))
    root = document
    if path.name == PYPROJECT:
        root = document.setdefault("tool", tomlkit.table()).setdefault("evalgate", tomlkit.table())
    engine = root.get("engine")
    if engine is None:
        engine = root["engine"] = tomlkit.table()
    if not isinstance(engine, dict):
        raise ConfigError(f"{path}: `engine` is not a table", fix="write it as an [engine] table")
    added = [key for key in settings if key not in engine]
    for key, value in settings.items():
        if key in engine:
            engine[key] = tomlkit.item(value).comment(why)  # set in place, saying why
    if added:
        # before the blank lines that end the table, so the next table keeps its spacing
        body = engine.value.body
        trailing = []
        while body and isinstance(body[-1][1], tomlkit.items.Whitespace):
            trailing.insert(0, body.pop()[1])
        engine.add(tomlkit.comment(why))
        for key in added:
            engine.add(key, settings[key])
        for whitespace in trailing:
            engine.add(whitespace)
    text = (BOM if written.startswith(BOM) else "") + tomlkit.dumps(document)  # a byte-order mark stays too
    write_text_atomic(path, text)  # all or nothing: a suite is never left half-written
