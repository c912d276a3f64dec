"""Every example of the documentation runs, against a real database.

The examples are the fenced ``python``, ``bash``, ``sh``, ``console`` and
``sql`` blocks of README.md and docs/**/*.md, one test each, named
``page:line``; an HTML comment before a block says how it runs (see
tests/docexamples.py for the annotations, tests/docrunner.py for how they
run).  A chain of blocks (a block and those that continue it) runs in a
folder of its own, with the venv's ``pgfence`` and ``python`` first on PATH
and ``PGFENCE_DSN`` naming its database, as a reader's shell would; runs
serve no metrics port unless the example asks for one
(``PGFENCE_METRICS_PORT=0`` in the environment, which a flag overrides).
The chains of a page share a fresh database, made for that page (one that
starts from an ``empty database`` gets its own); a block run on its own
(``-k``) first runs the blocks it continues.

The examples speak no SQL that depends on the server's version beyond what
the rest of the suite checks on every backend, so they run on the first
backend of ``PGFENCE_TEST_BACKENDS`` alone.
"""

from __future__ import annotations

import pytest

from conftest import BACKENDS, SERVER_DSN
from docexamples import (
    AnnotationError, Example, chain_end, chain_of, collect, collect_all, console_commands, output_matches,
)
from docrunner import Chain, Databases, run

EXAMPLES = collect_all()

#: Every example that is not run, by page and reason: a new one is a
#: deliberate change to this list.
NOT_RUN = [
    ('README.md',
     'installs pgfence into a fresh virtual environment and runs the 30-second demo; .ci/wheel-smoke does '
     'the same from the wheel'),
    ('README.md', "it is the test suite itself, which runs the docs' other examples; .ci/run runs it"),
    ('docs/how-to/deploy-container.md', 'needs a Docker daemon'),
    ('docs/how-to/deploy-container.md',
     'needs podman and a while to build the image; .ci/container runs these lines in CI'),
    ('docs/how-to/deploy-kubernetes.md', 'needs a Kubernetes cluster (kubectl, kustomize)'),
    ('docs/how-to/deploy-systemd.md', 'needs a systemd host and root (systemctl, /etc/systemd/system)'),
    ('docs/how-to/run-the-tests.md',
     "it is the test suite itself, which runs this page's other examples; .ci/run runs it"),
    ('docs/tutorial/first-job.md',
     'installs pgfence into a fresh virtual environment and runs the 30-second demo; .ci/wheel-smoke does '
     'the same from the wheel'),
]


class Chains:
    """The chains of the examples selected, their databases and folders."""

    def __init__(self, databases: Databases, selected: list[Example]) -> None:
        self.databases = databases
        self.made: dict[str, Chain] = {}
        self.extra: list[str] = []                      # databases of chains made again after a failure
        self.last_of_page = {e.page: e.id for e in selected}
        for example in selected:
            head = chain_of(EXAMPLES, example)[0]
            databases.prepare(self._key(head), head.empty_database)

    @staticmethod
    def _key(head: Example) -> str:
        return head.id if head.empty_database else head.page

    def get(self, examples: list[Example]) -> Chain:
        """The chain of ``examples``' last block, with the others run."""
        head, before = examples[0], [e.id for e in examples[:-1]]
        chain = self.made.get(head.id)
        if chain is not None and chain.ran == before:
            return chain
        if chain is None:
            dsn = self.databases.get(self._key(head), head.empty_database)
        else:
            chain.close()
            dsn = self.databases.fresh(head.empty_database)
            self.extra.append(dsn)
        chain = self.made[head.id] = Chain(dsn)
        for example in examples[:-1]:
            run(example, chain)
        return chain

    def forget(self, head: Example) -> None:
        chain = self.made.pop(head.id, None)
        if chain is not None:
            chain.close()

    def page_done(self, page: str) -> None:
        """Close the page's chains and drop its databases, behind the tests that follow."""
        for key in [k for k in self.made if k.startswith(page + ":")]:
            self.made.pop(key).close()
        for example in EXAMPLES:
            if example.page == page and not example.continues:
                self.databases.release(self._key(example))

    def close(self) -> None:
        for chain in self.made.values():
            chain.close()
        for dsn in self.extra:
            self.databases.drop(dsn)
        self.databases.close()


@pytest.fixture(scope="module")
def chains(request):
    admin_dsn = SERVER_DSN if BACKENDS[0] == "server" else request.getfixturevalue("embedded_admin_dsn")
    selected = [item.callspec.params["example"] for item in request.session.items
                if item.module is request.module and "example" in getattr(getattr(item, "callspec", None),
                                                                           "params", {})]
    made = Chains(Databases(admin_dsn), selected)
    yield made
    made.close()


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.id for e in EXAMPLES])
def test_example(example, chains):
    examples = chain_of(EXAMPLES, example)
    try:
        chain = chains.get(examples)
        run(example, chain)
        if chain_end(EXAMPLES, example):
            chain.stop()
    except BaseException:
        chains.forget(examples[0])
        raise
    finally:
        if chains.last_of_page.get(example.page) == example.id:
            chains.page_done(example.page)


def test_the_examples_not_run_are_exactly_these():
    assert [(e.page, e.not_run) for e in EXAMPLES if e.not_run] == NOT_RUN


# -- the collector (no database) -----------------------------------------------------


def _page(tmp_path, text: str):
    (tmp_path / "docs").mkdir(exist_ok=True)
    path = tmp_path / "docs" / "page.md"
    path.write_text(text)
    return collect(path, tmp_path)


def test_annotations_are_read_and_mistakes_refused(tmp_path):
    [first, second] = _page(tmp_path, """Text.

<!-- example: file jobs.py -->
```toml title="jobs.toml"
a = 1
```

<!-- example: continues previous; background until "up and running"; exit -15; free port 8465; env "A=b c" -->
```sh
  serve --port 8465
```
""")
    assert (first.id, first.file, first.language) == ("docs/page.md:4", "jobs.py", "toml")
    assert second.continues and second.background == ("text", "up and running") and second.exit == -15
    assert second.free_ports == [8465] and second.env == {"A": "b c"}
    for wrong, message in [
        ("<!-- example: frobnicate -->\n```sh\nls\n```\n", "unknown directive"),
        ("<!-- example: exit 1 -->\nsome text\n", "before no example"),
        ("<!-- example: exit 1 -->\n```text\nls\n```\n", "can only be a file"),
        ("<!-- example: not run: -->\n```sh\nls\n```\n", "needs a reason"),
        ("<!-- example: continues previous -->\n```sh\nls\n```\n", "continues nothing"),
    ]:
        with pytest.raises(AnnotationError, match=message):
            _page(tmp_path, wrong)


def test_a_console_block_is_its_commands_and_the_output_they_show():
    script, shown = console_commands("$ pgfence status \\\n    --json\n{\"a\": 1}\n...\n$ echo done\ndone\n")
    assert script == "pgfence status \\\n    --json\necho done\n" and shown == ['{"a": 1}', "...", "done"]
    assert output_matches(shown, '{"a":   1}\nother\ndone\n') is None
    assert output_matches(["done", '{"a": 1}'], '{"a": 1}\ndone\n') == '{"a": 1}'
