"""Print the kernel numpy's OpenBLAS runs on this CPU (OPENBLAS_CORETYPE overrides its pick at load time),
or "unknown" where numpy carries no OpenBLAS that says:

    python tools/openblas_core.py
"""
from __future__ import annotations

import ctypes
import glob
import os

import numpy

NAMES = ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename", "openblas_get_corename64_",
         "openblas_get_corename")


def openblas_core() -> str:
    for lib in glob.glob(os.path.join(os.path.dirname(numpy.__file__), os.pardir, "numpy.libs", "*openblas*.so*")):
        for name in NAMES:
            getter = getattr(ctypes.CDLL(lib), name, None)
            if getter is not None:
                getter.restype = ctypes.c_char_p
                return getter().decode()
    return "unknown"


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description="Print the kernel numpy's OpenBLAS runs on this CPU.").parse_args()
    print(openblas_core())
