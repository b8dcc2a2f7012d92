"""`liar jobs …` verbs on the embedded default (no worker needed to queue, list, show, cancel)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
import yaml

from app.cli import main
from tests.jobs.conftest import recipe


def test_jobs_verbs(tmp_path, job_models, monkeypatch, capsys):
    monkeypatch.setenv("LIAR_DATA_DIR", str(tmp_path / "data"))
    for k in ("LIAR_DATABASE_URL", "LIAR_BROKER_URL"):
        monkeypatch.delenv(k, raising=False)
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(recipe(job_models)))
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(recipe(job_models, ratio=2)))

    assert main(["jobs", "submit", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "invalid recipe: ratio: ratio must lie strictly between 0 and 1" in err
    assert "Traceback" not in err

    assert main(["jobs", "submit", str(good), "--user", "ada", "--json"]) == 0
    job_id = json.loads(capsys.readouterr().out)["id"]
    assert main(["jobs", "list"]) == 0
    out = capsys.readouterr().out
    assert "QUEUED" in out and "ada" in out
    assert main(["jobs", "show", str(job_id), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["status"] == "QUEUED" and info["recipe"]["ratio"] == 0.3
    assert main(["jobs", "cancel", str(job_id)]) == 0
    assert "CANCELLED" in capsys.readouterr().out
    assert main(["jobs", "show", "999"]) == 2
    assert "no job 999" in capsys.readouterr().err
    assert main(["jobs", "submit", str(good), "--sweep-ratios", "0.2", "0.4", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["jobs"]) == 2


def test_bad_input_is_one_sentence_and_creates_no_job(tmp_path, job_models, monkeypatch, capsys):
    """A YAML syntax error, a recipe that is a list, a model whose config.json is a list, and an
    evaluation longer than the model's positions: one clear line, exit 2, no job row."""
    monkeypatch.setenv("LIAR_DATA_DIR", str(tmp_path / "data"))
    for k in ("LIAR_DATABASE_URL", "LIAR_BROKER_URL"):
        monkeypatch.delenv(k, raising=False)
    syntax = tmp_path / "syntax.yaml"
    syntax.write_text("model: [unclosed\n")
    listed = tmp_path / "list.yaml"
    listed.write_text("- a\n- b\n")
    broken_model = tmp_path / "broken-model"
    broken_model.mkdir()
    (broken_model / "config.json").write_text("[1, 2]")
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(recipe(job_models, model=str(broken_model))))
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(recipe(job_models)))
    cases = [
        (["jobs", "submit", str(syntax)], "not valid YAML at line 2"),
        (["jobs", "submit", str(listed)], "must be a YAML mapping of fields, not a list"),
        (["jobs", "submit", str(broken)], "config.json must hold a JSON object"),
        (["jobs", "submit", str(good), "--ppl", str(job_models["calib"]), "--ppl-seq-len", "512"], "exceeds"),
        (["jobs", "submit", str(good), "--tasks", "piqa,no_such_task_here"], "unknown task 'no_such_task_here'"),
        (["jobs", "submit", str(good), "--task-limit", "10"], "and --num-fewshot need --tasks"),
        (["prune", str(syntax), "--output", str(tmp_path / "out")], "not valid YAML at line 2"),
        (["prune", str(broken), "--output", str(tmp_path / "out")], "config.json must hold a JSON object"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (argv, err)
        assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()
    assert main(["jobs", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_ppl_length_defaults_to_what_the_model_can_take(tmp_path, job_models, monkeypatch, capsys):
    """The tiny models have 256 positions: `--ppl` without --ppl-seq-len evaluates 256-token windows
    instead of failing after the pruning on the old 512 default."""
    monkeypatch.setenv("LIAR_DATA_DIR", str(tmp_path / "data"))
    for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):  # a server whose workers reach the Hub (registry
        monkeypatch.delenv(k, raising=False)  # tasks accepted); this process's hub library stays offline
    for k in ("LIAR_DATABASE_URL", "LIAR_BROKER_URL"):
        monkeypatch.delenv(k, raising=False)
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(recipe(job_models)))
    assert main(["jobs", "submit", str(good), "--ppl", str(job_models["calib"]), "--json"]) == 0
    job_id = json.loads(capsys.readouterr().out)["id"]
    assert main(["jobs", "show", str(job_id), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert [e["seq_len"] for e in info["evaluations"]] == [256]
    # lm-eval tasks beside it, names checked and stored as a list
    flags = ["--ppl", str(job_models["calib"]), "--tasks", "piqa, arc_easy", "--task-limit", "0.5", "--json"]
    assert main(["jobs", "submit", str(good), *flags]) == 0
    assert main(["jobs", "show", str(json.loads(capsys.readouterr().out)["id"]), "--json"]) == 0
    tasks = json.loads(capsys.readouterr().out)["evaluations"][1]
    assert (tasks["type"], tasks["tasks"], tasks["limit"]) == ("lm_eval", ["piqa", "arc_easy"], 0.5)


def test_listing_into_a_closed_pipe_ends_quietly(tmp_path, job_models):
    """`liar jobs list | head` ended with a BrokenPipe traceback: here the reader has gone before the
    command writes a byte (it closes its end at once; the command needs a second to start)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("LIAR_")}
    env["LIAR_DATA_DIR"] = str(tmp_path / "data")
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(recipe(job_models)))
    liar = [sys.executable, "-m", "app.cli"]
    subprocess.run([*liar, "jobs", "submit", str(good)], env=env, check=True, capture_output=True)
    proc = subprocess.Popen([*liar, "jobs", "list"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    stderr = proc.communicate(timeout=120)[1].decode()
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr
    assert proc.returncode == 0


def test_submit_in_the_flag_form_of_prune(tmp_path, job_models, monkeypatch, capsys):
    """`liar jobs submit --model M --ratio R --calibration C …` without writing YAML, as `liar prune`."""
    monkeypatch.setenv("LIAR_DATA_DIR", str(tmp_path / "data"))
    for k in ("LIAR_DATABASE_URL", "LIAR_BROKER_URL"):
        monkeypatch.delenv(k, raising=False)
    flags = ["--model", str(job_models["quick"]), "--ratio", "0.25", "--calibration", str(job_models["calib"])]
    flags += ["--criterion", "flap", "--samples", "8", "--seq-len", "32", "--json"]
    assert main(["jobs", "submit", *flags]) == 0
    job_id = json.loads(capsys.readouterr().out)["id"]
    assert main(["jobs", "show", str(job_id), "--json"]) == 0
    stored = json.loads(capsys.readouterr().out)["recipe"]
    assert stored["ratio"] == 0.25 and stored["criterion"]["name"] == "flap"
    assert stored["calibration"]["num_calibration_samples"] == 8
    assert main(["jobs", "submit", "--model", str(job_models["quick"])]) == 2
    assert "give a recipe file or at least --ratio or --speedup, --calibration" in capsys.readouterr().err
    assert main(["jobs", "submit", *flags[:4], "--calibration", str(job_models["calib"]), "--samples", "0"]) == 2
    assert "num_calibration_samples" in capsys.readouterr().err


def test_show_lists_the_files_and_the_stage_timings(tmp_path, job_models, monkeypatch, capsys):
    """`liar jobs show ID` of a finished job: each checkpoint file with its size and sha256, then a
    table of seconds per stage and per reconstructed layer."""
    from jobs.db import Job
    from jobs.service import JobService
    from jobs.settings import Settings
    from jobs.tasks import execute

    monkeypatch.setenv("LIAR_DATA_DIR", str(tmp_path / "data"))
    for k in ("LIAR_DATABASE_URL", "LIAR_BROKER_URL"):
        monkeypatch.delenv(k, raising=False)
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(recipe(job_models)))
    assert main(["jobs", "submit", str(good), "--json"]) == 0
    job_id = json.loads(capsys.readouterr().out)["id"]
    assert execute(job_id, Settings.from_env()) == "SUCCEEDED"
    assert main(["jobs", "show", str(job_id)]) == 0
    out = capsys.readouterr().out
    info = json.loads((main(["jobs", "show", str(job_id), "--json"]), capsys.readouterr().out)[1])
    checkpoint = next(a for a in info["artifacts"] if a["kind"] == "checkpoint")
    files = [a for a in info["artifacts"] if a["kind"] == "file"]
    assert f"   checkpoint: {checkpoint['path']} ({checkpoint['size']:,} bytes in {len(files)} files)" in out
    lines = out.splitlines()
    for a in files:
        assert any(
            line.startswith("         file: " + a["name"]) and line.endswith(f"{a['size']:,}  {a['sha256']}")
            for line in lines
        ), a["name"]
    assert "      timings: stage" in out
    for stage in ("load", "calibration", "scoring", "reconstruct", "export"):
        assert any(line.split()[:1] == [stage] for line in lines), stage
    assert any(line.split()[:2] == ["layer", "2/2"] for line in lines)
    total = next(line for line in lines if line.split()[:1] == ["total"])
    assert float(total.split()[1]) == pytest.approx(info["timings"]["total"], abs=0.06)

    # retention by hand: nothing set, a bad number, then a job old enough
    assert main(["jobs", "expire"]) == 2
    assert "no retention is set: give --days N, or set LIAR_RETENTION_DAYS" in capsys.readouterr().err
    assert main(["jobs", "expire", "--days", "0"]) == 2
    assert "--days is a positive number of days, not 0" in capsys.readouterr().err
    assert main(["jobs", "expire", "--days", "1"]) == 0
    assert capsys.readouterr().out.startswith("files removed of 0 jobs finished more than 1 day ago")
    service = JobService()
    with service.sessions.begin() as s:
        s.get(Job, job_id).finished_at -= dt.timedelta(days=2)
    assert main(["jobs", "expire", "--days", "1"]) == 0
    assert capsys.readouterr().out.strip() == f"files removed of 1 job finished more than 1 day ago: job {job_id}"
    assert service.show(job_id)["artifacts"] == [] and not Path(checkpoint["path"]).exists()


def test_export_writes_a_finished_checkpoint_for_serving_or_says_why_not(tmp_path, job_models, monkeypatch, capsys):
    """`liar jobs export ID --form F`: an export-only job of a succeeded job's checkpoint; a job not yet
    finished, an unknown form and a form the checkpoint cannot take are one sentence each, exit 2."""
    from core.models.tiny import tiny_decoder
    from jobs.settings import Settings
    from jobs.tasks import execute

    monkeypatch.setenv("LIAR_DATA_DIR", str(tmp_path / "data"))
    for k in ("LIAR_DATABASE_URL", "LIAR_BROKER_URL"):
        monkeypatch.delenv(k, raising=False)
    bpe = tiny_decoder(tmp_path / "data" / "models" / "bpe", tokenizer="bpe")  # a GGUF holds a BPE tokenizer
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(recipe(job_models, model=str(bpe))))
    assert main(["jobs", "submit", str(good), "--json"]) == 0
    job_id = json.loads(capsys.readouterr().out)["id"]
    assert main(["jobs", "export", str(job_id), "--form", "gguf-f16"]) == 2
    assert f"job {job_id} is QUEUED" in capsys.readouterr().err
    assert execute(job_id, Settings.from_env()) == "SUCCEEDED"
    assert main(["jobs", "export", str(job_id), "--form", "gguf-q9"]) == 2
    err = capsys.readouterr().err
    assert "'gguf-q9'" in err and "gguf-iq2_m" in err and "Traceback" not in err
    assert main(["jobs", "export", str(job_id), "--form", "gguf-f16", "--form", "gguf-q8_0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"job {job_id}: its checkpoint exported as gguf-f16, gguf-q8_0 by job ")
    export = int(out.split("by job ")[1].split()[0])
    assert main(["jobs", "export", str(job_id), "--form", "gguf-f16"]) == 2
    assert f"job {export} already exports job {job_id}'s checkpoint as gguf-f16" in capsys.readouterr().err
    assert execute(export, Settings.from_env()) == "SUCCEEDED"
    info = json.loads((main(["jobs", "show", str(export), "--json"]), capsys.readouterr().out)[1])
    names = {a["name"] for a in info["artifacts"] if a["kind"] == "file"}
    assert {f"liar-job-{job_id}-f16.gguf", f"liar-job-{job_id}-q8_0.gguf", "SHA256SUMS"} <= names
