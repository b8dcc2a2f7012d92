"""Property-based: random YAML / JSON shapes and values thrown at the recipe schema and at every submit
path never surface as a traceback, and an invalid recipe never becomes a job row."""

from __future__ import annotations

import math

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from app.cli import main
from core.spec.recipe import Recipe
from jobs.service import JobService, SubmitError
from jobs.settings import Settings

FIELDS = ["model", "ratio", "modules", "allocation", "round_to", "criterion", "reconstruction", "calibration"]
SUB = ["name", "options", "method", "damp", "dataset", "texts", "num_calibration_samples", "max_seq_length"]
SUB += ["batch_size", "holdout_samples", "neurons", "heads", "label_field", "positions", "seed", "text_field"]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**12), max_value=10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["liar", "flap", "both", "auto", "/etc/passwd", "~", "..", "wikitext2", "0.5"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(SUB), st.text(max_size=8)), inner, max_size=5),
    ),
    max_leaves=12,
)
recipes = st.one_of(values, st.dictionaries(st.sampled_from(FIELDS), values, max_size=8))
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _yaml(data) -> str:
    try:
        return yaml.safe_dump(data)
    except yaml.YAMLError:
        return str(data)


@FAST
@given(recipes)
def test_recipe_schema_raises_only_validation_errors(data):
    try:
        Recipe.model_validate(data)
    except (ValidationError, ValueError):
        pass
    try:
        Recipe.from_yaml(_yaml(data))
    except (ValidationError, ValueError):
        pass


@FAST
@given(st.text(max_size=200))
def test_any_text_as_a_recipe_is_a_clean_error(text):
    try:
        Recipe.from_yaml(text)
    except (ValidationError, ValueError):
        pass


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    data = tmp_path_factory.mktemp("prop") / "data"
    s = JobService(Settings(data_dir=data, database_url=f"sqlite:///{data / 'l.db'}", broker_url="filesystem://"))
    return s


@FAST
@given(recipes, st.booleans(), st.one_of(st.none(), st.lists(values, max_size=3)))
def test_the_job_service_refuses_with_one_sentence_and_creates_no_row(service, data, as_yaml, evaluations):
    before = len(service.list(limit=10_000))
    try:
        service.validate(_yaml(data) if as_yaml else data, evaluations, confine=True)
    except SubmitError as exc:
        assert "\n" not in str(exc) and "Traceback" not in str(exc)
        assert len(service.list(limit=10_000)) == before
    else:  # the random mapping happened to be a valid recipe: no file outside the roots got through
        assert isinstance(data, dict)


@FAST
@given(recipes)
def test_liar_prune_dry_run_never_shows_a_traceback(tmp_path_factory, capsys, data):
    path = tmp_path_factory.mktemp("cli") / "recipe.yaml"
    path.write_text(_yaml(data))
    code = main(["prune", str(path), "--output", str(path.parent / "out"), "--dry-run"])
    err = capsys.readouterr().err
    assert code in (0, 2) and "Traceback" not in err
    assert not (path.parent / "out").exists()


def test_strategies_reach_valid_and_invalid_recipes():
    """The property tests above are only worth something if random input can also be valid."""
    assert Recipe.model_validate({"model": "some/model", "ratio": 0.5, "calibration": {"texts": ["x"]}})
    assert not math.isnan(0.5)
