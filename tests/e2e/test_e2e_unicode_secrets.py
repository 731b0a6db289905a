"""Unicode prompts and secrets in the environment, end to end through the real CLI and the real vLLM CPU
engine (tiny local model).

- Unicode: emoji (ZWJ sequences, skin tones, flags), RTL Arabic/Hebrew with direction marks, combining
  marks (incl. Zalgo stacks), NUL-free control characters, CJK and astral-plane characters, in prompts and
  in the ids themselves, written to the prompts file as raw UTF-8. Baseline and check are stable, the
  database holds every prompt exactly as written, and the reports parse.
- Secrets: the values of secret-looking environment variables never reach the database (incl. its -wal and
  -shm files), the JSON report, `runs show` or any CLI output; the allow-listed names among them are
  stored as "<redacted>" in the fingerprint's `env` component.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from pathlib import Path

import pytest
from helpers import CLI, read_json, write_suite

pytestmark = pytest.mark.e2e

UNICODE_PROMPTS = [
    {"id": "emoji-👩‍👩‍👧‍👦", "prompt": "A family 👩‍👩‍👧‍👦, thumbs 👍🏽👍🏿, a coder 🧑🏻‍💻, flags 🇫🇷🏳️‍🌈 and ❤️‍🔥"},
    {"id": "rtl-عربي-עברית", "prompt": "مرحبا بالعالم — שלום עולם: mixed \u200fRTL\u200e and LTR \u202eoverride\u202c"},
    {"id": "combining-e\u0301", "prompt": "Cafe\u0301 vs Caf\u00e9; Z\u0337\u0322\u031b\u031ba\u0338\u0327\u034el\u0335\u0359\u035dg\u0336o\u0334"},  # noqa: E501
    {"id": "controls\t\x01", "prompt": "tab\there, SOH\x01, ESC\x1b[31mred\x1b[0m, ZWSP\u200b, LSEP\u2028, PSEP\u2029, NEL\x85 end"},
    {"id": "cjk-漢字", "prompt": "日本語のテキスト、中文文本，한국어 텍스트 and ｆｕｌｌｗｉｄｔｈ"},
    {"id": "astral-𝔘𝔫𝔦", "prompt": "Math 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕏, Gothic 𐌰𐌱𐌲, hieroglyph 𓀀, unicorn 🦄, private use \U000f0000"},
    {"id": "\u00a0 spaces \u3000", "prompt": "\ufeffBOM-led prompt with NBSP\u00a0and ideographic space\u3000"},
    {"id": 7, "prompt": "plain ASCII, an integer id"},
]


def write_unicode_prompts(ws: Path) -> None:
    """Raw UTF-8 in the file (conftest's writer escapes everything to ASCII)."""
    text = "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in UNICODE_PROMPTS)
    (ws / "prompts.jsonl").write_bytes(text.encode("utf-8"))
    assert "👩‍👩‍👧‍👦".encode() in (ws / "prompts.jsonl").read_bytes()


def test_unicode_prompts_and_ids_round_trip(cli, tmp_path, tiny_model):
    ws = tmp_path / "ws"
    suite = write_suite(ws, tiny_model, UNICODE_PROMPTS, concurrency=(1, 8), shuffles=1, max_tokens=8)
    write_unicode_prompts(ws)
    n = len(UNICODE_PROMPTS)

    cli("baseline", "create", suite, "--json-report", tmp_path / "create.json", check=0)
    assert read_json(tmp_path / "create.json")["counts"]["stable"] == n
    cli("check", suite, "--json-report", tmp_path / "check.json", check=0)
    report = read_json(tmp_path / "check.json")
    assert report["status"] == "pass" and report["exit_code"] == 0
    assert report["counts"]["stable"] == n and report["changed_components"] == []

    expected = {str(p["id"]): p["prompt"] for p in UNICODE_PROMPTS}
    with sqlite3.connect(ws / "evalgate.sqlite") as conn:
        for run_id in (1, 2):
            stored = dict(conn.execute("select key, prompt from requests where run_id = ?", (run_id,)).fetchall())
            assert stored == expected  # exact: no normalisation, no stripping, no escaping
            keys = {k for (k,) in conn.execute("select distinct request_key from outputs where run_id = ?", (run_id,))}
            assert keys == set(expected)
            # every request in every pass: 2 concurrency levels, the hot pass and 1 shuffled pass
            assert conn.execute("select count(*) from outputs where run_id = ? and pass_index >= 0",
                                (run_id,)).fetchone() == (4 * n,)
        assert conn.execute("select status, verdict from runs order by id").fetchall() == [
            ("complete", "pass"), ("complete", "pass")]

    shown = cli("runs", "show", "2", "--suite", suite, "--json", check=0)
    info = json.loads(shown.stdout)
    assert info["status"] == "complete" and info["requests"] == n and info["outputs"] == 4 * n
    assert info["summary"]["stable"] == n


SECRET_NAMES = ["VLLM_API_KEY", "HF_TOKEN", "OPENAI_API_KEY", "MY_SERVICE_SECRET", "DB_PASSWORD",
                "VLLM_AUTHORIZATION", "CUDA_SECRET_THING"]
# Names under an allow-listed prefix (fingerprint.ENV_PREFIXES): kept in `env`, with the value redacted.
ALLOW_LISTED = ["VLLM_API_KEY", "VLLM_AUTHORIZATION", "CUDA_SECRET_THING"]


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def test_secret_values_never_stored_or_printed(cli_env, tmp_path, tiny_model):
    secrets = {name: f"sk-test-{uuid.uuid4().hex}" for name in SECRET_NAMES}
    cli = CLI({**cli_env, **secrets}, tmp_path)
    ws = tmp_path / "ws"
    suite = write_suite(ws, tiny_model, [f"Prompt {i}: secrets stay secret" for i in range(6)],
                        concurrency=(1, 4), shuffles=0, max_tokens=8)

    procs = [
        cli("baseline", "create", suite, "--json-report", tmp_path / "create.json", check=0),
        cli("check", suite, "--json-report", tmp_path / "check.json", check=0),
    ]
    db = ws / "evalgate.sqlite"
    # inspect the -wal/-shm companions as the CLI left them, before this test opens the database
    companions = [p for p in (db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")) if p.exists()]
    blobs = {str(p): p.read_bytes() for p in [db, *companions]}
    procs.append(cli("runs", "show", "2", "--suite", suite, "--json", check=0))
    shown = json.loads(procs[-1].stdout)
    assert shown["status"] == "complete"

    for i, proc in enumerate(procs):
        blobs[f"call {i} stdout"] = proc.stdout.encode("utf-8")
        blobs[f"call {i} stderr"] = proc.stderr.encode("utf-8")
    for p in files_under(tmp_path):  # the database, reports, anything else a run left in the workspace
        blobs.setdefault(str(p), p.read_bytes())
    assert str(tmp_path / "check.json") in blobs and str(db) in blobs
    for where, data in blobs.items():
        for name, value in secrets.items():
            hex_part = value.removeprefix("sk-test-").encode()
            assert hex_part not in data, f"the value of {name} leaked into {where}"

    # the stored fingerprints: allow-listed secret names present and redacted, the others absent
    with sqlite3.connect(db) as conn:
        rows = conn.execute("select r.id, f.components from runs r join fingerprints f "
                            "on f.hash = r.fingerprint_hash order by r.id").fetchall()
    assert [r[0] for r in rows] == [1, 2]
    for _, components in rows:
        env = json.loads(components)["env"]["data"]
        for name in ALLOW_LISTED:
            assert env.get(name) == "<redacted>", (name, env.get(name))
        for name in set(SECRET_NAMES) - set(ALLOW_LISTED):
            assert name not in env
        assert env.get("OMP_NUM_THREADS") == "1"  # numerics variables stay visible
    assert read_json(tmp_path / "check.json")["changed_components"] == []
