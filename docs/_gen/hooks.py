"""MkDocs hooks of pgfence's documentation (``hooks:`` in mkdocs.yml).

- The package as users import it: the repository's folders do not carry the
  import name (``supervisor/`` is ``pgfence``), so the hook assembles a
  temporary ``pgfence/`` tree of symlinks, as ``.ci/typecheck`` does for
  mypy (its own function, loaded from there), puts it first on
  ``sys.path`` for the generated pages and hands it to mkdocstrings as the
  Python handler's ``paths``, for the API reference.
- Generated parts: a page region between ``<!-- generated: WHAT -->`` and
  ``<!-- end generated -->`` is replaced by the Markdown that
  ``reference.py`` renders from pgfence's declarations.  What stands
  between the markers in the source is the fallback shown on GitHub.
- Links to the repository's own files (``../../bench/README.md``,
  ``../../deploy/systemd/pgfence.service``) work on GitHub as they are; on
  the site the hook publishes each linked file under ``repo/`` (Markdown as
  a page, anything else as a static file) and points the link there, so
  that ``mkdocs build --strict`` checks them like any other link.
- Docstrings use reST roles (``:meth:`Job.fenced```): the API page keeps
  the code and drops the role's name.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import posixpath
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import reference  # noqa: E402  (beside this file, found through the line above)

#: Where the repository's linked files are published on the site.
PUBLISHED = "repo"

_REGION = re.compile(r"<!-- generated: (?P<what>[^>]+?) -->\n.*?<!-- end generated -->", re.DOTALL)
_LINK = re.compile(r"(?P<head>\]\()(?P<target>[^)\s#]+)(?P<anchor>#[^)\s]*)?(?P<tail>\))")
#: A reST role before a code span; with ``~``, the path before the last name goes too.
_ROLE = re.compile(r":(?:meth|func|class|mod|attr|data|exc|obj):(<code>)(?:~(?:[\w.]+\.)?)?")

_view: Path | None = None


def _build_view(dest: Path) -> None:
    loader = importlib.machinery.SourceFileLoader("pgfence_typecheck", str(REPO / ".ci" / "typecheck"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    module.build_view(REPO, dest)


@event_priority(100)      # before mkdocstrings reads its handlers' options
def on_config(config: Any) -> Any:
    global _view
    if _view is None:
        _view = Path(tempfile.mkdtemp(prefix="pgfence-docs-"))
        _build_view(_view)
        sys.path.insert(0, str(_view))
    python = config.plugins["mkdocstrings"].config.handlers.setdefault("python", {})
    python["paths"] = [str(_view)]
    return config


def on_shutdown() -> None:
    if _view is not None:
        shutil.rmtree(_view, ignore_errors=True)


def _repo_target(page_src: str, target: str, docs_dir: Path) -> Path | None:
    """The repository file a relative link of a page points at, when it
    lies outside the docs folder."""
    if "://" in target or target.startswith(("/", "mailto:")):
        return None
    path = (docs_dir / posixpath.dirname(page_src) / target).resolve()
    try:
        path.relative_to(docs_dir)
        return None
    except ValueError:
        pass
    try:
        path.relative_to(REPO)
    except ValueError:
        return None
    return path if path.is_file() else None


def on_files(files: Files, config: Any) -> Files:
    docs_dir = Path(config["docs_dir"]).resolve()
    wanted: set[Path] = set()
    for file in list(files):
        if not file.src_uri.endswith(".md") or file.abs_src_path is None:
            continue
        text = Path(file.abs_src_path).read_text(encoding="utf-8")
        for match in _LINK.finditer(text):
            target = _repo_target(file.src_uri, match["target"], docs_dir)
            if target is not None:
                wanted.add(target)
    for path in sorted(wanted):
        files.append(File.generated(config, f"{PUBLISHED}/{path.relative_to(REPO).as_posix()}",
                                    abs_src_path=str(path)))
    return files


def _render(what: str) -> str:
    kind, _, arg = what.partition(" ")
    if kind == "settings":
        return reference.settings_table()
    if kind == "cli":
        return reference.cli_reference()
    if kind == "metrics":
        return reference.metrics_table()
    if kind == "sql-function":
        return reference.sql_function(arg)
    if kind == "sql-other-functions":
        return reference.sql_other_functions(set(arg.split()))
    raise ValueError(f"unknown generated region {what!r}")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    markdown = _REGION.sub(lambda m: _render(m["what"]) + "\n", markdown)
    docs_dir = Path(config["docs_dir"]).resolve()

    def relink(match: re.Match[str]) -> str:
        target = _repo_target(page.file.src_uri, match["target"], docs_dir)
        if target is None:
            return match[0]
        published = f"{PUBLISHED}/{target.relative_to(REPO).as_posix()}"
        new = posixpath.relpath(published, posixpath.dirname(page.file.src_uri) or ".")
        return f"{match['head']}{new}{match['anchor'] or ''}{match['tail']}"

    return _LINK.sub(relink, markdown)


def on_page_content(html: str, page: Any, config: Any, files: Files) -> str:
    return _ROLE.sub(r"\1", html)
