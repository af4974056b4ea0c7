#!/usr/bin/env bash
# Wheels for scripts/gpu_check.sh, fetched on a machine with network to PyPI, for a GPU machine without it.
#
#   bash scripts/gpu_wheels.sh [FOLDER]      (default: shared/wheels, which the GPU check reads)
#
# The GPU machine has Python 3.12, torch, transformers 5.17, accelerate, peft, numpy, scipy, pandas, pyarrow,
# matplotlib, pytest and pytest-xdist; rsft needs these besides (their own dependencies, where not on that list,
# come with torch and transformers: filelock, fsspec, huggingface_hub, jinja2, packaging, psutil, pyyaml, tqdm).
# Pinned to the versions the CPU tests run with. Wheels only (--no-deps): CPython 3.12 on manylinux x86_64, or pure
# Python; antlr4-python3-runtime 4.9.3 (hydra-core's parser, pinned by it) has only a source release, so its
# wheel is built here. wandb is left out: its wheel alone is ~20 MB with a dozen dependencies (opentelemetry,
# pydantic, ...) and the GPU check runs with logger=none, which never imports it (rsft.tracking imports wandb
# only for logger=wandb). The folder must stay under 64 MiB, what a run on the device machine carries.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-shared/wheels}
PYTHON=${PYTHON:-python3}
PACKAGES=(
  trl==1.16.0
  datasets==5.2.0
  dill==0.4.1
  multiprocess==0.70.19
  xxhash==4.1.0
  hydra-core==1.3.8
  omegaconf==2.3.1
  gguf==0.19.0
  pytest-timeout==2.4.0
  pytest-xdist==3.8.0  # the GPU machine has it; here for one that lacks it
  execnet==2.1.2
)
mkdir -p "$DEST"
# no constraint file of this machine's: the pins above are the whole request
export PIP_CONSTRAINT=
"$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d "$DEST" "${PACKAGES[@]}"
"$PYTHON" -m pip wheel --no-deps -w "$DEST" antlr4-python3-runtime==4.9.3
# datasets 5.2 needs huggingface_hub >= 1.31; transformers 5.17 admits any 1.x. gpu_check.sh installs this one only
# where the machine's is older (its dependencies httpx, hf-xet and click come with transformers 5.17's own hub,
# though perhaps older than 1.33 asks: the check prints the versions it ends up with)
mkdir -p "$DEST/fallback"
"$PYTHON" -m pip download --no-deps --only-binary=:all: -d "$DEST/fallback" "huggingface_hub==1.33.0"
ls -lR "$DEST"
bytes=$(du -sb "$DEST" | cut -f1)
echo "$DEST: $((bytes / 1024)) KiB in $(ls "$DEST"/*.whl "$DEST"/fallback/*.whl | wc -l) wheels"
if (( bytes > 64 * 1024 * 1024 )); then
  echo "$DEST: over 64 MiB, more than a device run carries; leave a wheel out" >&2
  exit 1
fi
