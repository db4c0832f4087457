"""`seamkit findings`: the tiny-preset dry run of every step and its page, the refusal of a dirty
tree, and resuming (a step done at this commit is skipped, one of another commit runs again, an
interrupted study goes on through `seams_study(resume=True)`)."""

import json

import pytest

from seamkit import findings as F
from seamkit import findings_numbers, findings_page
from seamkit import report as rep
from seamkit.cli import main
from seamkit.seams.resume import study_state_path
from seamkit.stats import stats
from tests.seams.study_helpers import measure_once


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """The whole plan at the tiny preset, once for this file: (out folder, page path, summary)."""
    tmp = tmp_path_factory.mktemp("findings")
    out, page = tmp / "results", tmp / "docs" / "findings.md"
    with pytest.MonkeyPatch.context() as mp:
        measure_once(mp)
        summary = F.run_findings(preset="tiny", out_dir=out, page_path=page, allow_dirty=True, progress=False,
                                 pngs=False)
    return out, page, summary


def test_dry_run_writes_every_step_and_a_page_quoting_them(dry_run):
    """Every step runs and is published, and the page names each one and quotes its numbers as the
    JSON files hold them. Planted faults this catches: a render that drops a step's section or its
    findings row; a step left out of the plan or not published; the pruning step on another
    checkpoint than seams_n1's e2e; the forecast not checked against seams_n2's measured speeds."""
    out, page, summary = dry_run
    names = [s.name for s in F.PLAN]
    assert summary["ran"] == names and summary["published"] == names and summary["page"] == str(page)
    docs = {n: rep.read_json(out / f"{n}.json") for n in names}
    for n, doc in docs.items():
        assert doc["findings_step"]["step"] == n and doc["findings_step"]["commit"] == summary["commit"]
        assert (out / "run" / f"{n}.json").read_bytes() == (out / f"{n}.json").read_bytes()
    assert docs["pruning"]["checkpoint"] == docs["seams_n1"]["checkpoints"]["e2e"]
    assert docs["pruning"]["float64"]["dtype"] == "float64" and docs["pruning"]["float32"]["dtype"] == "float32"
    assert docs["forecast"]["validation"]["errors"]  # every candidate seams_n2 measured, forecast and compared
    assert docs["forecast"]["findings_step"]["needs"]["seams_n2"] == docs["seams_n2"]["findings_step"]["run_id"]
    assert docs["qwen"]["config"]["vocab"] == 151936 and docs["qwen"]["lm_head_flops_share"]["qwen"] > 0.5

    text = page.read_text()
    for n, title in findings_page.STEPS.items():
        assert f"## {title} (`{n}`)" in text and f"{n}.json" in text
    e2e_n2 = docs["seams_n2"]["aggregate"]["e2e"]["tokens_per_s"]["mean"]
    assert f"{e2e_n2:,.0f}" in text
    speedup = stats([w["speedup"] for w in docs["pruning"]["float32"]["windows"]])["mean"]
    assert f"{speedup:.2f}x" in text
    assert docs["forecast"]["time_to_target"]["break_even"] in text
    assert f"{docs['qwen']['lm_head_flops_share']['qwen']:.0%} of a step's FLOPs" in text
    assert "a dirty tree, --allow-dirty" in text or not summary["commit"].endswith("-dirty")
    assert "PNG figures were not drawn: not asked for" in text
    assert str(out.parent) not in text  # links relative to the page: no machine path in a committed page
    manifest = json.loads((out / findings_page.MANIFEST).read_text())
    assert "figures/seams_n2_placement.html" in manifest["html"]


def test_dirty_tree_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    """Planted faults this catches: a dirty tree run anyway (its results would name a commit that
    is not what ran); the refusal as a traceback, or after folders were made."""
    monkeypatch.setattr(rep, "git_commit", lambda: "abc-dirty")
    argv = ["findings", "--preset", "tiny", "--out", str(tmp_path / "o"), "--page", str(tmp_path / "p" / "f.md")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("seamkit findings: error: the working tree has uncommitted changes")
    assert "--allow-dirty" in err
    assert main(argv + ["--only", "nope"]) == 2
    assert "--only nope: no such step" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def _plan(calls: list, stop: dict):
    """Three fake steps: `a`, `b` reading a, and a study `s` that stops (KeyboardInterrupt, its
    state left on disk, as an interrupted seams study leaves it) while stop["s"] is set."""
    def step(name):
        def fn(ctx, resume):
            calls.append((name, resume))
            if stop.get(name):
                study_state_path(ctx.path(name)).parent.mkdir(parents=True, exist_ok=True)
                study_state_path(ctx.path(name)).write_text("{}")
                raise KeyboardInterrupt
            return {"value": len(calls)}
        return fn
    return [F.Step("a", step("a")), F.Step("b", step("b"), needs=("a",)),
            F.Step("s", step("s"), study=lambda ctx: ctx.cfg({"seams.devices": 1}))]


def test_resume_skips_done_steps_and_reruns_what_another_commit_made(tmp_path, monkeypatch):
    """Planted faults this catches: done steps run again; a step made at another commit (or
    reading a step run again since) skipped; an interrupted study started over instead of resumed,
    or resumed across commits; previous/ replaced on every publish, or as a whole by a run of one
    step."""
    calls, stop = [], {"s": True}
    monkeypatch.setattr(rep, "git_commit", lambda: "c1")

    def run():
        calls.clear()
        return F.run_findings(preset="tiny", out_dir=tmp_path, page_path=None, plan=_plan(calls, stop),
                              progress=False)
    with pytest.raises(KeyboardInterrupt):
        run()
    assert calls == [("a", False), ("b", False), ("s", False)]
    stop["s"] = False
    assert run()["skipped"] == ["a", "b"] and calls == [("s", True)]  # the study goes on where it stopped
    assert run()["ran"] == [] and calls == []

    doc = json.loads((tmp_path / "run" / "a.json").read_text())
    doc["findings_step"]["commit"] = "c0"  # a made at another commit: a again, and b, which reads it
    (tmp_path / "run" / "a.json").write_text(json.dumps(doc))
    assert run()["ran"] == ["a", "b"]
    monkeypatch.setattr(rep, "git_commit", lambda: "c2")
    stop["s"] = True
    with pytest.raises(KeyboardInterrupt):
        run()
    assert calls == [("a", False), ("b", False), ("s", False)]  # nothing of c1's resumed at c2
    assert json.loads((tmp_path / "a.json").read_text())["findings_step"]["commit"] == "c1"  # published at the end
    stop["s"] = False
    for _ in range(2):  # c2's first publish keeps c1's files in previous/; its next one keeps them there
        run()
        assert json.loads((tmp_path / "a.json").read_text())["findings_step"]["commit"] == "c2"
        kept = json.loads((tmp_path / findings_page.PREVIOUS / "a.json").read_text())["findings_step"]
        assert kept["commit"] == "c1"
    # one step run again at c3 (--only): its file of c2 becomes its previous one; the others keep c1's
    monkeypatch.setattr(rep, "git_commit", lambda: "c3")
    F.run_findings(preset="tiny", out_dir=tmp_path, page_path=None, plan=_plan(calls, stop), progress=False, only="a")
    commits = {n: json.loads((tmp_path / findings_page.PREVIOUS / f"{n}.json").read_text())["findings_step"]["commit"]
               for n in ("a", "b")}
    assert commits == {"a": "c2", "b": "c1"}


def test_the_page_sets_the_previous_run_beside_this_one(dry_run, tmp_path):
    """Each headline figure against the previous run's, each mean inside the other's interval.
    Planted faults this catches: a figure moved outside the previous interval still called
    repeated; a step run at another budget compared as if it were the same; the section missing;
    previous files of several commits called one run."""
    out, _, _ = dry_run
    here, prev = tmp_path / "out", tmp_path / "out" / findings_page.PREVIOUS
    prev.mkdir(parents=True)
    for n in findings_page.STEPS:
        doc = rep.read_json(out / f"{n}.json")
        rep.write_json(here / f"{n}.json", doc)
        if n == "seams_n1":  # the previous run's local gap far from this run's
            gap = doc["aggregate"]["paired"]["loss_gap_local_minus_e2e"]
            gap["mean"], gap["ci95"] = gap["mean"] + 5, [gap["mean"] + 4.9, gap["mean"] + 5.1]
        if n == "own_head":
            doc["budget_seconds"] = 60.0
        rep.write_json(prev / f"{n}.json", doc)
    rows = {r["figure"]: r for r in findings_numbers.repeat(findings_numbers.load(here), findings_numbers.load(prev))}
    assert rows["seams_n1: local gap to e2e"]["within"] is False
    assert rows["seams_n1: local gap to e2e"]["holds_zero"] is False
    assert rows["seams_n1: delayed gap to e2e"]["holds_zero"] is True
    assert rows["seams_n1: delayed gap to e2e"]["within"] is True
    assert rows["seams_n2: local tokens/s over e2e"]["within"] is True
    own = rows["own_head: gap minus aux_head's"]
    assert own["within"] is None and own["changed"].startswith("budget_seconds 60.0 then")
    assert rows["qwen: local gap to e2e"]["changed"] == "no interval (one seed or window)"  # one seed at tiny
    text = findings_page.render(here, tmp_path / "docs" / "findings.md")
    assert "## Against the previous run" in text and "| seams_n1: local gap to e2e |" in text
    assert "[previous/](../out/previous/)" in text and "**no**" in text
    assert "The run published before this one (commit" in text
    # one step run again since (--only): the steps' previous files come from two commits
    doc = rep.read_json(prev / "qwen.json")
    doc["findings_step"]["commit"] = "f" * 40
    rep.write_json(prev / "qwen.json", doc)
    text = findings_page.render(here)
    assert "Each step's file published before this run's (commit " in text and "ffffffffffff" in text
