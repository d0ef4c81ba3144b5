"""BLAS's triangular product and rank-k update, called without holding Python's lock.

numpy has no triangular product (TRMM) and no in-place rank-k update (SYRK with ``beta = 1``);
scipy's wrappers of them (``scipy.linalg.blas.dtrmm``, ``dsyrk``) hold the GIL while BLAS runs.
In dask's threaded scheduler (the local default) two tasks' products then take turns: measured
on 2 cores, one BLAS thread per task, 5 TRMMs of 4,000 x 1,000 rows took 0.22 s in one thread
and 0.43 s in two (numpy's ``Z.T @ Z`` 0.22 s in both), so the wide kernel's quadratic forms ran
on one core whatever the workers' threads.

Here the same routines of the same library (scipy's BLAS, through the function pointers
``scipy.linalg.cython_blas`` exports) are called through :mod:`ctypes`, which releases the GIL
for the call: the same results, bit for bit, and the products of two tasks run side by side.
Where the pointers cannot be had, scipy's wrappers are used.
"""

from __future__ import annotations

import ctypes

import numpy as np
from scipy.linalg.blas import dsyrk as _scipy_syrk
from scipy.linalg.blas import dtrmm as _scipy_trmm
from scipy.linalg.blas import strmm as _scipy_trmm32

__all__ = ["RELEASES_GIL", "syrk_update", "trmm_rows"]

_CHAR, _INT, _DOUBLE = ctypes.c_char_p, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_double)
_FLOAT = ctypes.POINTER(ctypes.c_float)


def _function(name: str, *argtypes):
    """The cython_blas routine ``name`` as a ctypes function (None where it cannot be had)."""
    try:
        from scipy.linalg import cython_blas

        capsule = cython_blas.__pyx_capi__[name]
        get_name = ctypes.pythonapi.PyCapsule_GetName
        get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
        get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
        get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
        address = get_pointer(capsule, get_name(capsule))
    except Exception:
        return None
    return ctypes.CFUNCTYPE(None, *argtypes)(address) if address else None


# void dtrmm(char *side, char *uplo, char *transa, char *diag, int *m, int *n, double *alpha,
#            double *a, int *lda, double *b, int *ldb)
_TRMM = _function("dtrmm", _CHAR, _CHAR, _CHAR, _CHAR, _INT, _INT, _DOUBLE, _DOUBLE, _INT, _DOUBLE, _INT)
_TRMM32 = _function("strmm", _CHAR, _CHAR, _CHAR, _CHAR, _INT, _INT, _FLOAT, _FLOAT, _INT, _FLOAT, _INT)
# void dsyrk(char *uplo, char *trans, int *n, int *k, double *alpha, double *a, int *lda, double *beta,
#            double *c, int *ldc)
_SYRK = _function("dsyrk", _CHAR, _CHAR, _INT, _INT, _DOUBLE, _DOUBLE, _INT, _DOUBLE, _DOUBLE, _INT)

#: Whether the products below run without the GIL (False: scipy's wrappers, which hold it).
RELEASES_GIL = _TRMM is not None and _TRMM32 is not None and _SYRK is not None


def _int(v: int):
    return ctypes.byref(ctypes.c_int(int(v)))


def _double(v: float):
    return ctypes.byref(ctypes.c_double(float(v)))


def _ptr(a: np.ndarray):
    return a.ctypes.data_as(_DOUBLE)


def trmm_rows(L: np.ndarray, Z: np.ndarray) -> np.ndarray:
    """``Z L`` in place: ``Z`` C-contiguous rows (n x p), ``L`` lower triangular p x p in Fortran
    order, both float64 or both float32.  In BLAS's column-major terms ``Z`` is ``Z^T`` and this is
    ``L^T Z^T``."""
    n, p = Z.shape
    single = Z.dtype == np.float32 and L.dtype == np.float32
    routine = _TRMM32 if single else _TRMM
    if (routine is None or not (Z.flags.c_contiguous and L.flags.f_contiguous)
            or not (single or Z.dtype == L.dtype == np.float64)):
        (_scipy_trmm32 if single else _scipy_trmm)(1.0, L, Z.T, side=0, lower=1, trans_a=1, overwrite_b=1)
        return Z
    if n and p:
        if single:
            one, a, b = ctypes.byref(ctypes.c_float(1.0)), L.ctypes.data_as(_FLOAT), Z.ctypes.data_as(_FLOAT)
        else:
            one, a, b = _double(1.0), _ptr(L), _ptr(Z)
        routine(b"L", b"L", b"T", b"N", _int(p), _int(n), one, a, _int(p), b, _int(p))
    return Z


def syrk_update(alpha: float, Y: np.ndarray, C: np.ndarray | None) -> np.ndarray:
    """``C + alpha Y^T Y`` (``C`` None: 0) in the upper triangle of ``C``, Fortran order, in place
    where ``C`` is given; the lower triangle is left as it was (zeros for a new ``C``)."""
    Y = np.ascontiguousarray(Y, dtype=np.float64)
    m, q = Y.shape
    if C is None:
        C = np.zeros((q, q), order="F")
    if _SYRK is None or not C.flags.f_contiguous:
        return _scipy_syrk(alpha, Y.T, beta=1.0, c=C, trans=0, lower=0, overwrite_c=1)
    if m and q:
        _SYRK(b"U", b"N", _int(q), _int(m), _double(alpha), _ptr(Y), _int(q), _double(1.0), _ptr(C), _int(q))
    return C
