"""stepgraph from Python: the kernel library (stepgraph.kernels, with NumPy fallbacks where
there is no GPU) and decode sessions (stepgraph.Session), over stepgraph's C ABI through
ctypes. The shared libraries are built by CMake; see stepgraph._lib for where they are
looked for."""

from . import kernels
from ._lib import LibraryNotFound, set_library_dir
from .kernels import StepgraphError, device_available
from .session import Session, SessionError

__all__ = ["kernels", "Session", "SessionError", "StepgraphError", "LibraryNotFound",
           "device_available", "set_library_dir"]
__version__ = "0.2.0"
