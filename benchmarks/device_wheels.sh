#!/usr/bin/env bash
# The wheels a lent GPU machine lacks, for `make gpu-check` there. Its image has torch, onnx,
# onnxscript, onnxruntime (CPU), click, pyyaml, rich, numpy and matplotlib, but not pydantic
# or polygraphy; it runs Python 3.12 on x86-64 and reaches no package index. This downloads
# them into .whl/ (git-ignored; ~3 MB), at the versions this project is tested with.
# On that machine, from the repository root:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   PYTHONPATH=/tmp/site make gpu-check PY=python3
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl \
    pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
    polygraphy==0.53.6
ls -1 .whl
