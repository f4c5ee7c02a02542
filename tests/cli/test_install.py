"""`pip install .` gives a working autopar outside the checkout: every source file of every
package (the three top-level folders setup.cfg maps into ``autopar.*`` included) is in the wheel,
with the LICENSE, and the installed copy imports and plans from another directory.

The install goes into a ``--target`` folder and runs with ``python -S`` and an explicit path: the
test's own environment holds an editable install of this checkout whose import hook would find a
file the wheel lacks, and a fresh virtual environment would need torch installed again.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
# source folder -> where its files go in the installed package (the layout docs/architecture.md gives)
SOURCES = {"autopar": "autopar", "codegen": "autopar/codegen", "cost_models": "autopar/cost_models",
           "search": "autopar/search"}
NOT_INSTALLED = {"tests", "benchmarks", "examples", "docs"}  # folders of the checkout, not the package
CACHES = ("__pycache__", "*.pyc", ".git", ".venv", "build", "dist", "*.egg-info", ".pytest_cache", ".hypothesis")


def _source_files() -> set[str]:
    """Every file of the packages, by its path in the installed package."""
    out = set()
    for folder, target in SOURCES.items():
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                out.add(f"{target}/{path.relative_to(ROOT / folder).as_posix()}")
    return out


def test_every_python_package_of_the_checkout_is_one_the_wheel_is_checked_for():
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    assert packages - NOT_INSTALLED <= SOURCES.keys(), "a new top-level package: add it to setup.cfg and SOURCES"


def test_the_license_is_the_apache_license_setup_cfg_declares():
    text = (ROOT / "LICENSE").read_text()
    assert "license = Apache-2.0" in (ROOT / "setup.cfg").read_text()
    assert text.split()[:5] == ["Apache", "License", "Version", "2.0,", "January"]
    assert "END OF TERMS AND CONDITIONS" in text and len(text.splitlines()) > 150


@pytest.mark.slow
def test_the_wheel_installs_a_working_autopar_outside_the_checkout(tmp_path):
    src = tmp_path / "src"  # a copy: a build folder left in the checkout would hide a file setup.cfg lost
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*CACHES))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    r = subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w",
                        str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("autopar-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(_source_files() - names)
    assert not missing, f"the wheel lacks {missing[:10]}: list the package (data) in setup.cfg"
    info = {n.split("/", 1)[1] for n in names if n.split("/", 1)[0].endswith(".dist-info")}
    assert "licenses/LICENSE" in info
    assert "autopar = autopar.cli:main" in zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()

    site = tmp_path / "site"
    r = subprocess.run([*pip, "install", "--no-deps", "--no-index", "-q", "--target", str(site), str(wheel)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # -S: no .pth files, so no editable hook; torch and the other dependencies from their folder
    env = dict(os.environ, PYTHONPATH=f"{site}{os.pathsep}{Path(torch.__file__).parents[1]}", OMP_NUM_THREADS="1")
    check = ("import importlib, pkgutil, autopar; assert autopar.__file__.startswith(%r), autopar.__file__; "
             "[importlib.import_module(m.name) for m in pkgutil.walk_packages(autopar.__path__, 'autopar.') "
             "if not m.name.endswith('__main__')]; "
             "print('imported')" % str(site))
    r = subprocess.run([sys.executable, "-S", "-c", check], capture_output=True, text=True, timeout=300,
                       cwd=elsewhere, env=env)
    assert r.returncode == 0 and r.stdout == "imported\n", r.stderr[-3000:]
    r = subprocess.run([sys.executable, "-S", str(site / "bin" / "autopar"), "plan", "zoo:gpt"], capture_output=True,
                       text=True, timeout=300, cwd=elsewhere, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("autopar plan for gpt on ") and "predicted step time" in r.stdout
