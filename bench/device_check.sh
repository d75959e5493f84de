#!/usr/bin/env bash
# The GPU path of issue 14 item 2, on a machine with a CUDA device (NOT run yet: no device
# was lent to the session that wrote it; see bench/README.md, "The GPU path").
#
#   bash bench/device_check.sh            # from the repository root, with .venv installed
#
# 1. the tests that need a CUDA device: the torch backend on CUDA against the numpy
#    reference (codecs bit for bit, merges fp32-close), and the CUDA staging buffers of
#    a learner's capture and align against the CPU path (bit for bit);
# 2. merge + outer step GB/s on the device against its copy bandwidth (goal >= 50%);
# 3. capture and align per fragment on CUDA (staging) against the earlier tensor-by-tensor
#    copies, with the pinned host copy of the same bytes as the bound;
# 4. the side stream: this tree's staging against 8c5736f's (the transfers on the current
#    stream), idle and with ~5 ms of matmuls queued before each align (which an align's
#    transfer on the side stream overlaps; the align's time runs to the device's end);
# 5. a closer's round on the device (bench_closer_device, then figure 4 of compare.py on
#    gm's side): delta payloads decoded and judged on CUDA, merged, stepped and encoded
#    there, theta brought home, against numpy and against the host decode it replaced, in
#    f32, bf16, fp8 and fp4 (tests/runtime/test_closer_device.py in step 1 holds the CUDA
#    path to the host one, bit for bit).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
"$PY" -m pytest -q -p no:cacheprovider tests/numerics/test_backends.py tests/runtime/test_device_path.py \
  tests/runtime/test_closer_device.py -k "cuda"
"$PY" -m bench.bench_device --mib 256
"$PY" -m bench.bench_staging --device cuda --sizes 16,256 --repeat 5
"$PY" -m bench.bench_staging --device cuda --sizes 16,256 --repeat 5 --stage-before 8c5736f
"$PY" -m bench.bench_staging --device cuda --sizes 16,256 --repeat 5 --stage-before 8c5736f --busy-ms 5
"$PY" -m bench.bench_closer_device --device cuda --mib 256 --repeat 5
"$PY" bench/compare.py --only 4 --gm-only --merge-mib 256 --repeat 5 --merge-format BF16
