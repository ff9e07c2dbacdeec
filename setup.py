"""The compiled fast paths: optional C extensions, one per pipeline stage, beside that stage.

Everything else is declared in pyproject.toml. Each extension is `optional=True`: on a machine
without a C compiler `pip install .` still succeeds and the bridge runs its pure-Python code,
which stays the reference implementation (`VLLM_TRACE_BRIDGE_PURE=1` forces it;
docs/performance.md).
"""

from setuptools import Extension, setup

_FLAGS = ["-O2", "-std=c11", "-Wall", "-Wno-missing-braces"]


def _fast(stage: str, name: str) -> Extension:
    """bridge/<stage>/<name>.c, with the header every fast path shares (bridge/_native.h)."""
    return Extension(f"bridge.{stage}.{name}", [f"bridge/{stage}/{name}.c"], include_dirs=["bridge"],
                     depends=["bridge/_native.h"], extra_compile_args=_FLAGS, optional=True)


setup(ext_modules=[
    _fast("assemble", "_fastbuild"),
    _fast("decode", "_fastdecode"),
    _fast("export", "_fastwire"),
    _fast("parse", "_fastseed"),
])
