"""What a kernel call needs to know of its arrays: NumPy arrays (host memory) and device
tensors taken through DLPack (`__dlpack__`, which PyTorch tensors of every dtype have) or
`__cuda_array_interface__`, and a minimal CUDA runtime for staging NumPy arrays on a GPU.
"""

import ctypes
from ctypes import POINTER, Structure, c_int32, c_int64, c_uint8, c_uint16, c_uint64, c_void_p

import numpy as np

from . import _lib

_NUMPY_DTYPES = {np.dtype(np.float32): _lib.F32, np.dtype(np.float16): _lib.F16,
                 np.dtype(np.int32): _lib.I32}
_DTYPE_NAMES = {_lib.F32: "f32", _lib.BF16: "bf16", _lib.F16: "f16", _lib.I32: "i32"}
_ITEMSIZE = {_lib.F32: 4, _lib.BF16: 2, _lib.F16: 2, _lib.I32: 4}


def dtype_name(code):
    return _DTYPE_NAMES.get(code, "?")


class Array:
    """One argument: where it lives, its address, shape and dtype code."""

    def __init__(self, obj, device, ptr, shape, dtype, keep=None, host=None):
        self.obj = obj
        self.device = device  # False: host memory (a NumPy array)
        self.ptr = ptr
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype
        self.keep = keep  # keeps a DLPack capsule alive during the call
        self.host = host  # the NumPy array of a host argument

    @property
    def size(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self):
        return self.size * _ITEMSIZE[self.dtype]


class _DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class _DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class _DLTensor(Structure):
    _fields_ = [("data", c_void_p), ("device", _DLDevice), ("ndim", c_int32),
                ("dtype", _DLDataType), ("shape", POINTER(c_int64)),
                ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


_DL_CPU, _DL_CUDA, _DL_CUDA_MANAGED = 1, 2, 13
_DL_INT, _DL_FLOAT, _DL_BFLOAT = 0, 2, 4
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _dl_dtype(code, bits, lanes):
    if lanes == 1:
        if code == _DL_FLOAT and bits == 32:
            return _lib.F32
        if code == _DL_FLOAT and bits == 16:
            return _lib.F16
        if code == _DL_BFLOAT and bits == 16:
            return _lib.BF16
        if code == _DL_INT and bits == 32:
            return _lib.I32
    raise TypeError("dtype (code %d, %d bits, %d lanes) is not f32, bf16, f16 or i32"
                    % (code, bits, lanes))


def _contiguous(shape, strides):
    expected = 1
    for d, s in zip(reversed(shape), reversed(strides)):
        if d != 1 and s != expected:
            return False
        expected *= d
    return True


def _from_dlpack(obj, what):
    capsule = obj.__dlpack__()
    t = _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    shape = [t.shape[i] for i in range(t.ndim)]
    if t.strides and not _contiguous(shape, [t.strides[i] for i in range(t.ndim)]):
        raise ValueError("%s: a device tensor must be contiguous (row-major)" % what)
    return Array(obj, True, (t.data or 0) + t.byte_offset, shape,
                 _dl_dtype(t.dtype.code, t.dtype.bits, t.dtype.lanes), keep=capsule)


def _from_cai(obj, what):
    cai = obj.__cuda_array_interface__
    typestr = {"<f4": _lib.F32, "<f2": _lib.F16, "<i4": _lib.I32}.get(cai["typestr"])
    if typestr is None:
        raise TypeError("%s: dtype %s is not f32, f16 or i32" % (what, cai["typestr"]))
    shape = cai["shape"]
    strides = cai.get("strides")
    if strides is not None and not _contiguous(
            shape, [s // _ITEMSIZE[typestr] for s in strides]):
        raise ValueError("%s: a device tensor must be contiguous (row-major)" % what)
    return Array(obj, True, cai["data"][0], shape, typestr)


def view(obj, what):
    """The Array of a NumPy array or a device tensor."""
    if isinstance(obj, np.ndarray):
        if obj.dtype not in _NUMPY_DTYPES:
            raise TypeError("%s: NumPy dtype %s is not float32, float16 or int32"
                            % (what, obj.dtype))
        if not obj.flags.c_contiguous:
            raise ValueError("%s: the array must be C-contiguous" % what)
        return Array(obj, False, obj.ctypes.data, obj.shape, _NUMPY_DTYPES[obj.dtype],
                     host=obj)
    if hasattr(obj, "__dlpack_device__"):
        device_type, _ = obj.__dlpack_device__()
        if device_type in (_DL_CUDA, _DL_CUDA_MANAGED):
            return _from_dlpack(obj, what)
        if device_type == _DL_CPU:
            return view(np.from_dlpack(obj), what)
    if hasattr(obj, "__cuda_array_interface__"):
        return _from_cai(obj, what)
    raise TypeError("%s: expected a NumPy array or a device tensor (DLPack or "
                    "__cuda_array_interface__), got %s" % (what, type(obj).__name__))


class Cuda:
    """The few CUDA runtime calls that staging NumPy arrays on a GPU needs."""

    _H2D, _D2H = 1, 2

    def __init__(self):
        self._rt = None
        for name in ("libcudart.so", "libcudart.so.13", "libcudart.so.12"):
            try:
                self._rt = ctypes.CDLL(name)
                break
            except OSError:
                continue
        if self._rt is None:
            raise RuntimeError("a GPU is present but the CUDA runtime (libcudart) cannot be "
                               "loaded to stage NumPy arrays; pass device tensors instead")
        self._rt.cudaMalloc.argtypes = [POINTER(c_void_p), ctypes.c_size_t]
        self._rt.cudaFree.argtypes = [c_void_p]
        self._rt.cudaMemcpy.argtypes = [c_void_p, c_void_p, ctypes.c_size_t, c_int32]

    def _check(self, err, what):
        if err != 0:
            raise RuntimeError("CUDA runtime error %d in %s" % (err, what))

    def alloc(self, nbytes):
        p = c_void_p()
        self._check(self._rt.cudaMalloc(ctypes.byref(p), max(int(nbytes), 1)), "cudaMalloc")
        return p.value

    def free(self, ptr):
        self._rt.cudaFree(ptr)

    def upload(self, dst, src, nbytes):
        self._check(self._rt.cudaMemcpy(dst, src, nbytes, self._H2D), "cudaMemcpy")

    def download(self, dst, src, nbytes):
        self._check(self._rt.cudaMemcpy(dst, src, nbytes, self._D2H), "cudaMemcpy")
