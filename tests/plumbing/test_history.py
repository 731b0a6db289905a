"""`evalgate runs history SUITE`: a suite's judged runs at a glance, on both backends, from the report stored
with each run: a passing baseline and check, an explained change after a weight swap, and a regression."""

from __future__ import annotations

import json
import re
import shutil

from helpers import GREEN_PROMPTS, bare_model, database_url, write_suite

from evalgate.store import open_store


def test_history_shows_each_runs_verdict_changes_and_metrics(inline_cli, tmp_path, fake_model, store_url):
    model = tmp_path / "model"
    shutil.copytree(fake_model, model)
    suite = write_suite(tmp_path / "ws", model, GREEN_PROMPTS[:4], concurrency=(1, 4), shuffles=0, kind="fake",
                        database=store_url)
    inline_cli("baseline", "create", suite, check=0)  # pass, promoted
    inline_cli("check", suite, check=0)  # pass: nothing changed
    bare_model(model, seed=1)
    inline_cli("check", suite, check=0)  # the weights changed: explained changes, passing
    suite.write_text(suite.read_text(encoding="utf-8").replace('kind = "fake"', 'kind = "fake"\nfake_vary_with_batch = ["p001"]'),
                     encoding="utf-8")
    inline_cli("check", suite, check=1)  # batch variance: a regression
    store = open_store(database_url(suite))
    runs = [r.id for r in store.runs()]
    # a metric in the latest check's stored report, as an lm-eval suite's would be
    latest = store.get_run(max(runs))
    metrics = [{"task": "t", "metric": "acc,none", "baseline": 0.5, "current": 0.25, "delta": -0.25, "moved": []}]
    store.set_report(latest.id, {**latest.report, "metrics": metrics})

    shown = inline_cli("runs", "history", suite, check=0)
    rows = json.loads(inline_cli("runs", "history", suite, "--json", check=0).stdout)
    assert [r["run"] for r in rows] == sorted(runs, reverse=True)
    assert [(r["kind"], r["verdict"]) for r in rows] == [("check", "regression"), ("check", "pass"), ("check", "pass"),
                                                         ("baseline", "pass")]
    assert rows[0]["counts"]["batch_variance"] == 1 and rows[1]["counts"]["explained_change"] == 4
    assert rows[1]["changed"] == ["model"] and rows[2]["changed"] == [] and rows[3]["changed"] == []
    assert "engine" in rows[0]["changed"]  # the fake's setting is an engine argument
    assert rows[0]["metrics"] == [{"task": "t", "metric": "acc,none", "current": 0.25, "delta": -0.25}]
    lines = shown.stdout.splitlines()
    assert lines[0].split() == ["run", "finished", "kind", "verdict", "counts", "changed", "metrics"]
    assert "t acc,none 0.25 (-0.25)" in lines[1] and "regression" in lines[1] and "explained_change 4" in lines[2]
    # by name, with the database named
    by_name = json.loads(inline_cli("runs", "history", "test", "--db", database_url(suite), "--json", check=0).stdout)
    assert by_name == rows and json.loads(inline_cli("runs", "history", suite, "--json", "--limit", "1").stdout) == rows[:1]
    # the HTML report's history strip: the same runs, oldest first, the shown run outlined, the metric's line
    page = tmp_path / "report.html"
    inline_cli("report", "--latest", "--suite", suite, "--html", page, check=0)
    html = page.read_text(encoding="utf-8")
    strip = html[html.index('<svg class="history"'):html.index("</svg>")]
    titles = re.findall(r"<rect [^>]*><title>run (\d+) \((\w+)[^)]*\): (\w+)", strip)
    assert [(int(run), kind, verdict) for run, kind, verdict in titles] == [(r["run"], r["kind"], r["verdict"]) for r in rows[::-1]]
    assert strip.count('stroke="#000"') == 1 and re.search(rf'stroke="#000"[^>]*><title>run {rows[0]["run"]} ', strip)
    assert "t acc,none" in strip and strip.count("<circle") == 1  # one run's stored report has the metric
    assert "<script" not in html


def test_the_history_reads_without_the_model_from_the_suite_table_alone(inline_cli, tmp_path, fake_model):
    """A teammate, a dashboard or a PR-comment job with no model, no lock and no Hub (an empty Hugging Face
    cache, offline): the commands that only read runs need the suite's [suite] table, nothing else."""
    from helpers import InlineCLI

    ws = tmp_path / "ws"
    suite = write_suite(ws, fake_model, GREEN_PROMPTS[:3], concurrency=(1,), shuffles=0, kind="fake", name="team")
    inline_cli("baseline", "create", suite, check=0)
    inline_cli("check", suite, check=0)
    # the suite as the team has it: a Hub model, on a machine that has neither it nor its lock
    suite.write_text(suite.read_text(encoding="utf-8").replace(f'model = "{fake_model}"', 'model = "acme/private-model"'),
                     encoding="utf-8")
    laptop = InlineCLI({**inline_cli.env, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "empty-hf")}, ws)
    assert "evalgate fetch" in laptop("check", check=2).stderr  # the suite itself cannot load here

    listed = json.loads(laptop("runs", "list", "--json", check=0).stdout)
    assert [(r["run"], r["suite"]) for r in listed] == [(2, "team"), (1, "team")]
    assert [r["run"] for r in json.loads(laptop("baseline", "list", "--json", check=0).stdout)] == [1]
    history = json.loads(laptop("runs", "history", "--json", check=0).stdout)
    assert [(r["run"], r["verdict"]) for r in history] == [(2, "pass"), (1, "pass")]
    assert laptop("runs", "show", "2", check=0).stdout
    assert laptop("diff", "1", "2", check=0).stdout
    # --latest in the suite's folder: the newest run of the suite found there, no --suite needed
    assert "wrote the report of run 2" in laptop("report", "--latest", "--html", tmp_path / "r.html", check=0).stdout
    assert (tmp_path / "r.html").stat().st_size > 0
    laptop("pr-comment", "--latest", "--dry-run", "--body-file", tmp_path / "c.md", check=0)
    assert "evalgate" in (tmp_path / "c.md").read_text()


def test_the_html_report_of_many_differences_is_paged(inline_cli, tmp_path, fake_model):
    """1,050 requests that all vary with the batch: a page renders the token diffs of 500 of them and lists the
    others by key; `--page` writes the others, and a page past the last is refused naming the range."""
    prompts = [f"Paged prompt {i}" for i in range(1050)]
    keys = ", ".join(f'"p{i:03d}"' for i in range(len(prompts)))
    suite = write_suite(tmp_path / "ws", fake_model, prompts, concurrency=(1, 2), shuffles=0, kind="fake",
                        hot_pass=False, extra_engine=f"fake_vary_with_batch = [{keys}]")
    inline_cli("baseline", "create", suite, "--allow-variance", check=1)
    pages = {}
    for page in (1, 3):
        inline_cli("report", "1", "--suite", suite, "--html", tmp_path / f"{page}.html", "--page", str(page), check=0)
        pages[page] = (tmp_path / f"{page}.html").read_text()
    assert len(re.findall(r'<section class="request[^"]*" id="req-', pages[1])) == 500
    assert len(re.findall(r'<section class="request[^"]*" id="req-', pages[3])) == 50
    assert "page 1 of 3: differing requests 1 to 500 of 1,050" in pages[1]
    assert "page 3 of 3: differing requests 1,001 to 1,050 of 1,050" in pages[3]
    assert "... and 550 more: p500 (batch_variance)" in pages[1] and "p1049 (batch_variance)" in pages[1]
    assert "p000 (batch_variance)" in pages[3] and "p1000 (batch_variance)" not in pages[3]
    refused = inline_cli("report", "1", "--suite", suite, "--html", tmp_path / "4.html", "--page", "4", check=2)
    assert "has 3 pages of differing requests (500 a page), not page 4" in refused.stderr
    assert not (tmp_path / "4.html").exists()
