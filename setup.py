"""Build hook for the opt-in compiled core, the way black and mypy ship theirs: with `ATTRIB_MYPYC=1` the modules
listed in attrib_agent/agent/build_kind.py are built by mypyc into extension modules; without it the package is pure
Python. pyproject.toml holds every piece of metadata; this file adds only `ext_modules`.

    ATTRIB_MYPYC=1 .venv/bin/pip install --no-build-isolation .    # or `pip wheel --no-build-isolation -w dist .`

(`--no-build-isolation` uses this environment's setuptools and mypy, which ships mypyc; needs a C compiler and the
Python headers.)
"""

from __future__ import annotations

import os
import sys
from importlib.util import module_from_spec, spec_from_file_location
from pathlib import Path

from setuptools import setup


def _compiled_sources() -> list[str]:
    """The list from attrib_agent/agent/build_kind.py, loaded from its file (importing the package is not needed)."""
    spec = spec_from_file_location("_attrib_build_kind", Path(__file__).parent / "attrib_agent/agent/build_kind.py")
    assert spec is not None and spec.loader is not None
    mod = module_from_spec(spec)
    spec.loader.exec_module(mod)
    return list(mod.compiled_sources())


if os.environ.get("ATTRIB_MYPYC", "0") == "1":
    try:
        from mypyc.build import mypycify
    except ImportError:
        sys.exit("ATTRIB_MYPYC=1 needs mypy (it ships mypyc) where the package builds: install mypy and build with "
                 "`pip install --no-build-isolation .`")
    setup(ext_modules=mypycify(_compiled_sources(), opt_level="3"))
else:
    setup()
