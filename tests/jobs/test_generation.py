"""The prompt box's round trip on both stacks (``jobs.generation``): a ``liar.generate`` task sent to a
real worker, its answer back through the result backend beside the broker (a folder beside the
filesystem broker's, or Redis), and an export-only job run by the same worker."""

from __future__ import annotations

import pytest

from jobs import export_jobs, generation
from tests.jobs.conftest import recipe, wait_for

pytestmark = pytest.mark.integration


def test_a_worker_answers_the_prompt_box_and_runs_an_export(stack, job_models):
    service = stack.service()
    stack.start_worker()
    job_id = service.submit(recipe(job_models, query_heads="uniform"), submitted_by="ada")
    info = wait_for(lambda: service.show(job_id)["status"] in ("SUCCEEDED", "FAILED") and service.show(job_id))
    assert info["status"] == "SUCCEEDED", info["error"]
    answer = generation.request(service, job_id, "the model keeps", 5, wait=120)
    for side in ("pruned", "dense"):
        assert 1 <= answer[side]["tokens"] <= 5 and answer[side]["tokens_per_s"] > 0, answer
    export = export_jobs.submit(service, job_id, ["vllm"])
    done = wait_for(lambda: service.show(export)["status"] in ("SUCCEEDED", "FAILED") and service.show(export))
    assert done["status"] == "SUCCEEDED", done["error"]
    assert "vllm/config.json" in {f["name"] for f in service.downloads(export)}
