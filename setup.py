"""The compiled fast paths: optional C extensions, one per pipeline stage, beside that stage.

Everything else is declared in pyproject.toml. Each extension is `optional=True`: on a machine
without a C compiler `pip install .` still succeeds and the bridge runs its pure-Python code,
which stays the reference implementation (`VLLM_TRACE_BRIDGE_PURE=1` forces it; README
"Performance").
"""

from setuptools import Extension, setup

_FLAGS = ["-O2", "-std=c11", "-Wall", "-Wno-missing-braces"]

setup(ext_modules=[
    Extension("bridge.assemble._fastbuild", ["bridge/assemble/_fastbuild.c"], extra_compile_args=_FLAGS,
              optional=True),
    Extension("bridge.assemble._fastfeed", ["bridge/assemble/_fastfeed.c"], extra_compile_args=_FLAGS,
              optional=True),
    Extension("bridge.decode._fastdecode", ["bridge/decode/_fastdecode.c"], extra_compile_args=_FLAGS,
              optional=True),
    Extension("bridge.export._fastwire", ["bridge/export/_fastwire.c"], extra_compile_args=_FLAGS, optional=True),
    Extension("bridge.parse._fastseed", ["bridge/parse/_fastseed.c"], extra_compile_args=_FLAGS, optional=True),
])
