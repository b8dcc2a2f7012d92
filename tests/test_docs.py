"""The README and docs/ against the results they quote (``bench/render_docs.py``, ``make docs``).

Every number in a generated block comes from ``docs/results/``: a number typed into a block, or a
re-run benchmark whose numbers the docs were not regenerated for, fails here. So do a README longer
than a front door, a results page missing from the index, and a link to a file or heading that does
not exist. Standard library only: no model is built.
"""

import re
import shlex
from pathlib import Path

import pytest

from bench import render_docs
from bench.pages import values
from bench.render_docs import PAGES, RESULTS, ROOT, render_text

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")  # links and images


def test_committed_docs_equal_what_the_results_render():
    assert render_docs.stale_files() == [], "run `make docs` and commit the result"


def test_a_number_typed_into_a_block_is_replaced_by_the_rendered_one():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- results:readme -->\n(.*?)<!-- /results -->", text, re.S).group(1)
    edited = text.replace(block, block.replace("|", "| 99.9", 1))
    assert edited != text
    assert render_text(edited) == text


def test_an_unknown_block_is_refused_by_name():
    with pytest.raises(KeyError, match="no-such-block"):
        render_text("<!-- results:no-such-block -->\n<!-- /results -->\n")


# A measured quantity: a time, a size, a rate or a speed-up. Percentages are left out (ratios are settings).
MEASURE = re.compile(r"(?<![\w.])\d[\d,]*(\.\d+)?\s?(s|ms|GB|MB|MiB|GFLOP/s|TFLOP)\b|\d\.\d+\s?×")
# Settings and sizes worked out from shapes, not measurements: the 70B / 7B activation sizes of the
# streaming section, the obs cap, the upload limit and the jobs table's refresh.
NOT_MEASURED = {"1 GB", "17 GB", "2.3 GB", "1.2 ×", "50 MB", "2 s"}


def _prose(text: str) -> str:
    """``text`` without code blocks and generated blocks."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.sub(r"<!-- results:[\w-]+ -->.*?<!-- /results -->", "", text, flags=re.S)


@pytest.mark.parametrize("doc", ["README.md", "docs/guide.md", "docs/deploy-one-host.md", "docs/design.md"])
def test_no_measurement_is_typed_outside_the_generated_blocks(doc):
    text = (ROOT / doc).read_text()
    if doc == "docs/design.md":  # its decisions; the older narrative sections quote their dated runs inline
        text = text[text.index("## Decisions the measurements settled") :]
    typed = [m.group(0) for m in MEASURE.finditer(_prose(text))]
    assert [t for t in typed if t not in NOT_MEASURED] == []


def test_the_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250
    assert "make run" in lines[3] and "make test" in lines[4]  # the two commands come first


def test_every_results_page_is_in_the_index_and_every_json_belongs_to_a_page():
    files = {p.name for p in RESULTS.iterdir() if p.is_file() and p.name != "README.md"}
    pages = {f for f in files if not f.endswith(".json")}
    data = {j for page in PAGES.values() for j in page.data}
    assert pages == set(PAGES), "add the page to its family's PAGES in bench/pages/ (or remove it from there)"
    assert {f for f in files if f.endswith(".json")} == data
    index = (RESULTS / "README.md").read_text()
    for name, page in PAGES.items():
        assert f"[{name}]({name})" in index
        assert page.claims, f"{name} states no claim"
    assert not [f for f in files if f.endswith("-notes.md")], "fold notes into docs/design.md's decisions"


def test_the_gemm_rows_appear_only_when_time_json_has_their_keys(monkeypatch):
    """bench/speed.py time reports the prune beside its products at the GEMM rate of the same run: the
    README's and the index's rows for it come from those keys, and are absent without them."""
    row = dict(render_docs.time_row(128))
    for key in ("gemm_gflops", "product_seconds", "ratio_to_products", "ratio"):
        row.pop(key, None)
    monkeypatch.setattr(values, "time_row", lambda samples, name="time.json": row)
    claim = "the same prune against its matrix products"
    assert render_docs.product_ratio() is None
    assert "against the machine" not in render_docs.render_readme()
    assert claim not in render_docs.render_index()
    row.update(gemm_gflops=400.0, product_seconds=16.0, ratio_to_products=1.25)
    assert render_docs.product_ratio().startswith("1.25× the time of its matrix products (16.0 s at the 400 GFLOP/s")
    assert "against the machine" in render_docs.render_readme()
    assert claim in render_docs.render_index()


def _commands(doc: Path) -> list[str]:
    """The ``liar …`` lines of a document's bash blocks, continuation lines joined, comments dropped."""
    blocks = re.findall(r"```bash\n(.*?)```", doc.read_text(), re.S)
    text = "\n".join(blocks).replace("\\\n", " ")
    lines = (line.split(" #")[0].strip().rstrip("&").strip() for line in text.splitlines())
    return [line for line in lines if line.startswith("liar ")]


@pytest.mark.parametrize("doc", [ROOT / "README.md", ROOT / "docs/guide.md", ROOT / "docs/deploy-one-host.md"])
def test_every_command_shown_parses(doc, capsys):
    """Each ``liar`` command of the docs is accepted by the CLI's own parser (nothing runs)."""
    from app.cli import build_parser

    commands = _commands(doc)
    assert commands or doc.name == "deploy-one-host.md"
    parser = build_parser()
    for command in commands:
        argv = shlex.split(command)[1:]
        try:
            parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{doc.name}: `{command}` is refused: {capsys.readouterr().err.strip()}")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {_slug(m) for m in re.findall(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve_to_files_and_headings(doc):
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # an external address
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(target)
    assert broken == []
