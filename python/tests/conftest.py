# The tests import the package from this checkout (python/src), whether or not it is
# installed, and find the libraries in the repository's build folders (see stepgraph._lib).
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "src"))

# tools/test.sh runs the suite once per build folder it made: it names the folder here.
_dir = os.environ.get("STEPGRAPH_LIB_DIR")
if _dir:
    import stepgraph

    stepgraph.set_library_dir(_dir)
