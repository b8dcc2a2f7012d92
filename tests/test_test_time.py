"""`make test`'s timing table (tests/timing.py) and its page (bench/test_time.py): a real pytest run of a
small test module writes the JSON, and the page is rendered from it."""

import json
import os
import subprocess
import sys
from pathlib import Path

from bench import test_time

ROOT = Path(__file__).resolve().parents[1]


def test_a_run_writes_each_marker_time_and_the_page_renders_from_it(tmp_path):
    out = tmp_path / "test_time.json"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_bench_flops.py"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [*cmd, "--durations=3", f"--test-time={out}"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "time per marker" in run.stdout and "slowest 3 durations" in run.stdout
    r = json.loads(out.read_text())
    ran = int(run.stdout.split(" passed")[0].split()[-1])
    assert sum(m["tests"] for m in r["markers"]) == ran
    assert {m["marker"] for m in r["markers"]} <= {"deploy", "browser", "integration", "slow", "unmarked"}
    assert 0 < len(r["slowest"]) <= 25 and all(
        t["test"].startswith("tests/test_bench_flops.py::") for t in r["slowest"]
    )
    assert test_time.main(["--json", str(out)]) == 0
    page = out.with_suffix(".md").read_text()
    assert f"Measured {r['date']} on {r['machine']}" in page
    assert f"| {r['markers'][0]['marker']} | {r['markers'][0]['tests']} |" in page
    assert r["slowest"][0]["test"] in page


def test_without_durations_nothing_is_printed(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_bench_flops.py"]
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 0 and "time per marker" not in run.stdout


def test_a_bad_json_is_refused_in_one_sentence(tmp_path, capsys):
    bad = tmp_path / "t.json"
    bad.write_text('{"date": "2026-11-29"}')
    assert test_time.main(["--json", str(bad)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not a test-time JSON" in err and not bad.with_suffix(".md").exists()


def test_the_page_says_when_each_process_ran_out_of_files():
    r = json.loads((ROOT / "docs" / "results" / "test_time.json").read_text())
    page = test_time.render({**r, "processes": 3, "processes_done": [870.4, 881.0, 902.6]})
    assert "Each process ran out of files at 870, 881, 903 s" in page
    assert "ran out of files" not in test_time.render({k: v for k, v in r.items() if k != "processes_done"})
