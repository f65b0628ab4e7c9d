# Where the package finds libstepgraph_c.so and libstepgraph_session_c.so (stepgraph._lib):
# an installed package (a copy of the modules outside the checkout) uses the libraries next
# to itself and never a build folder around it; STEPGRAPH_LIB_DIR, when set, is the one
# folder looked at. Each case runs in a fresh interpreter, since a process loads the
# libraries once.
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "python", "src", "stepgraph")
LIBS = ("libstepgraph_c.so", "libstepgraph_session_c.so")

PROBE = """
import os, stepgraph
from stepgraph import _lib
try:
    s = stepgraph.Session(None, backend="cpu", max_seq=8)
    print("loaded", os.path.realpath(_lib._loaded[_lib.SESSION_LIBRARY]._name))
except stepgraph.LibraryNotFound as e:
    print("missing", e)
"""


def built_libraries():
    """The folder the suite runs against (STEPGRAPH_LIB_DIR from tools/test.sh)."""
    d = os.environ.get("STEPGRAPH_LIB_DIR")
    if not d or not all(os.path.isfile(os.path.join(d, n)) for n in LIBS):
        pytest.skip("STEPGRAPH_LIB_DIR does not name a folder with the libraries")
    return d


def probe(site, env_dir=None):
    env = {k: v for k, v in os.environ.items() if k not in ("STEPGRAPH_LIB_DIR", "PYTHONPATH")}
    env["PYTHONPATH"] = str(site)
    if env_dir is not None:
        env["STEPGRAPH_LIB_DIR"] = str(env_dir)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=str(site), text=True,
                         capture_output=True, check=True).stdout.strip()
    return out.split(" ", 1)


@pytest.fixture
def installed(tmp_path):
    """A package laid out as pip installs it, in prefix/lib/python3/site-packages, with a
    stray build folder of the libraries around it (an earlier version of the package looked
    in site-packages/../build/nocuda)."""
    libs = built_libraries()
    site = tmp_path / "lib" / "python3" / "site-packages"
    shutil.copytree(PACKAGE, site / "stepgraph",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    for stray in (tmp_path / "build" / "nocuda", site.parent / "build" / "nocuda",
                  site.parent / "build"):
        stray.mkdir(parents=True, exist_ok=True)
        for n in LIBS:
            os.symlink(os.path.join(libs, n), stray / n)
    return site


def test_an_installed_package_never_uses_a_stray_build_folder(installed):
    state, message = probe(installed)
    assert state == "missing", message
    assert "pip install ./python" in message and "build" + os.sep + "nocuda" not in message


def test_the_libraries_next_to_the_package_are_used(installed):
    libs = built_libraries()
    for n in LIBS:
        shutil.copy(os.path.join(libs, n), installed / "stepgraph" / n)
    state, where = probe(installed)
    assert state == "loaded"
    assert where == os.path.realpath(str(installed / "stepgraph" / LIBS[1]))


def test_stepgraph_lib_dir_is_the_one_folder(installed, tmp_path):
    libs = built_libraries()
    for n in LIBS:
        shutil.copy(os.path.join(libs, n), installed / "stepgraph" / n)
    state, where = probe(installed, env_dir=libs)
    assert (state, where) == ("loaded", os.path.realpath(os.path.join(libs, LIBS[1])))
    # Named and empty: an error naming it, not a fallback to the package's own.
    empty = tmp_path / "empty"
    empty.mkdir()
    state, message = probe(installed, env_dir=empty)
    assert state == "missing" and str(empty) in message and "STEPGRAPH_LIB_DIR" in message
