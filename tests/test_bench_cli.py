"""bench/run.sh's command line: its help installs nothing."""

from __future__ import annotations

import shutil
import subprocess
import sys

from pgtools import ROOT


def test_bench_help_prints_the_options_and_installs_nothing(tmp_path):
    """On a checkout with no bench/.venv and no .venv (a copy of bench/ in a
    folder of its own), --help prints the usage and exits 0, and neither
    virtual environment is made."""
    bench = tmp_path / "bench"
    shutil.copytree(ROOT / "bench", bench, ignore=shutil.ignore_patterns(".venv", "results", "__pycache__"))
    for args in (["--help"], ["--quick", "-h"]):
        proc = subprocess.run(["bash", str(bench / "run.sh"), *args], capture_output=True, text=True, timeout=60,
                              env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable})
        assert (proc.returncode, proc.stderr) == (0, "")
        assert proc.stdout.startswith("usage: bench/run.sh [-h]")
        assert "--io-systems IO_SYSTEMS" in proc.stdout and "--only ONLY" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench"]
    assert not (bench / ".venv").exists()
