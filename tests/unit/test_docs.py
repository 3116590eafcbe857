"""The guide holds together: every relative link and anchor in README.md and docs/ resolves, docs/README.md
links every page, the command line's reference is its parser's (every command and option described),
and the front page stays a front page."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from kafka_batch.cli import reference
from kafka_batch.cli.commands import build_parser
from kafka_batch.config import PROJECT_ROOT

PAGES = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def anchors(page: Path) -> set[str]:
    """The anchors GitHub makes of a page's headings: lower case, punctuation dropped, spaces as hyphens,
    a repeated one numbered."""
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", FENCE.sub("", page.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower()).replace(" ", "-")
        found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return found


def links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    return [a or b for a, b in LINK.findall(text)]


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:: not ours to check here
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target} (no {resolved.relative_to(PROJECT_ROOT) if resolved.is_relative_to(PROJECT_ROOT) else resolved})")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target} (no heading #{anchor} in {resolved.relative_to(PROJECT_ROOT)})")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(PROJECT_ROOT)))
def test_every_relative_link_and_anchor_resolves(page):
    assert broken_links(page) == []


def test_the_check_sees_a_broken_link_and_a_broken_anchor(tmp_path, monkeypatch):
    """The check itself, on a page with one good and two broken links (and a link in a code block, which is
    not one)."""
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## A section: with `code`\n\n[ok](#a-section-with-code) [gone](missing.md)"
                    " [bad](#no-such) [self](page.md#title)\n\n```\n[in a fence](ignored.md)\n```\n")
    monkeypatch.setitem(globals(), "PROJECT_ROOT", tmp_path)
    assert broken_links(page) == ["missing.md (no missing.md)", "#no-such (no heading #no-such in page.md)"]


def test_the_guide_index_links_every_page():
    index = PROJECT_ROOT / "docs" / "README.md"
    linked = {(index.parent / target.partition("#")[0]).resolve() for target in links(index)}
    pages = {page.resolve() for page in PAGES if page.parent != PROJECT_ROOT and page != index}
    assert sorted(str(p.relative_to(PROJECT_ROOT)) for p in pages - linked) == []


def test_the_readme_is_a_front_page():
    text = (PROJECT_ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    assert "docs/README.md" in text


def test_the_command_line_reference_is_its_parser():
    assert (PROJECT_ROOT / "docs" / "cli.md").read_text() == reference.commands_markdown(build_parser()), \
        "stale: run `make schema`"


def test_every_command_and_option_is_described():
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    undescribed = [choice.dest for choice in commands._choices_actions if not choice.help]
    for name, sub in commands.choices.items():
        undescribed += [f"{name} {'/'.join(a.option_strings) or a.dest}" for a in sub._actions
                        if not a.help and not isinstance(a, argparse._HelpAction)]
    assert undescribed == []
