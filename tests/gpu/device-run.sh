#!/usr/bin/env bash
# Builds cachalot on the GPU machine and runs the gpu suite (and the CPU suites, as a cross-check of the
# toolchain there). The machine has nvcc, meson and ninja but no Debian packages: uthash's headers, CMocka
# and meson-python travel in .device/ (made by tests/gpu/prepare-device-deps.sh on a Debian machine).
# Usage: tests/gpu/device-run.sh [OUTDIR]   (results and logs go to OUTDIR, default ./device-out)
# DEVICE_RUN_PARTS (default "core,backend,torch") picks the parts, so that each fits one 10-minute device
# call:
#   core     the gpu suite, the CPU suites, the soak and its compute-sanitizer run, the demo, the example,
#            the LD_PRELOAD interposer
#   backend  the Python package installed with pip, then the PyTorch backend beside the native allocator
#            (tests/gpu/torch_backend_test.py; ONLY=a,b picks its scenarios, for a call too short for all)
#   torch    the package, pinned memory side by side, the stats comparison, PyTorch's viewer on
#            cachalot's snapshots, the pluggable route, DDP (2 GPUs)
#   suite  PyTorch's own allocator tests natively and under cachalot (tests/gpu/pytorch_suite.py), from
#          PYTORCH_TESTS (default .pytorch-tests/, git-ignored: see that script for how to fill it);
#          PYTORCH_SUITE_FILES and PYTORCH_SUITE_MODES pick files and modes, so that a run fits a call
set -u -o pipefail
out=${1:-${OUT:-./device-out}}
mkdir -p "$out"
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
parts=",${DEVICE_RUN_PARTS:-core,backend,torch},"
export PATH=/usr/local/cuda/bin:$PATH
export LD_LIBRARY_PATH="$root/.device/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -1; meson --version; } 2>&1 | tee "$out/machine.txt"
rm -rf build-gpu
meson setup build-gpu -Dcuda=enabled -Dtests=enabled -Ddeps_dir=.device >"$out/setup.log" 2>&1 || { tail -30 "$out/setup.log"; exit 1; }
ninja -C build-gpu >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
rc=0
if [[ $parts == *,core,* ]]; then
  meson test -C build-gpu --suite gpu --print-errorlogs -v 2>&1 | tee "$out/gpu-suite.log" || rc=1
  meson test -C build-gpu --no-suite gpu --no-suite soak --print-errorlogs 2>&1 | tail -12 | tee "$out/cpu-suites.log" || rc=1
  # The soak: threads x streams x graphs with patterns verified on the device, then under compute-sanitizer.
  meson test -C build-gpu --suite soak --print-errorlogs -v 2>&1 | grep -E '^soak|PASS|FAIL|Ok:|Fail:' |
    tee "$out/soak.log" || rc=1
  if command -v compute-sanitizer >/dev/null; then
    compute-sanitizer --tool memcheck --leak-check full --error-exitcode 3 build-gpu/tests/gpu_soak \
      "${SOAK_SANITIZER_SECONDS:-20}" expandable_segments:True 2>&1 | tail -6 | tee "$out/soak-memcheck.log" || rc=1
  fi
  ./build-gpu/tools/cachalot_demo 2>&1 | tee "$out/demo.log" || rc=1
  # The example program, and the LD_PRELOAD interposer under an unmodified program.
  ./build-gpu/streams_and_graph 2>&1 | tee "$out/example.log" || rc=1
  bash tests/gpu/preload_test.sh build-gpu "$out/preload" 2>&1 | tee "$out/preload.log" || rc=1
fi
if [[ $parts == *,backend,* || $parts == *,torch,* ]] && python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  # The Python package, as a user installs it (against the torch already there; deps_dir for uthash,
  # which this machine lacks).
  PYTHONPATH="$root/.device/py" python3 -m pip install -q --no-build-isolation --no-index \
    -Csetup-args=-Ddeps_dir=.device "$root" >"$out/pip-install.log" 2>&1 || { tail -30 "$out/pip-install.log"; rc=1; }
  (cd /tmp && python3 -c 'import cachalot, cachalot.torch as t; print("cachalot", cachalot.__version__, "C", cachalot.version(), "backend:", t.backend_unavailable() or "available")') 2>&1 |
    tee "$out/package.log" || rc=1
fi
if [[ $parts == *,backend,* ]] && python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  # The PyTorch backend beside the native allocator.
  (cd /tmp && PYTHONUNBUFFERED=1 python3 "$root/tests/gpu/torch_backend_test.py" "$out/backend") 2>&1 |
    tee "$out/torch-backend.log" || rc=1
fi
if [[ $parts == *,torch,* ]] && python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  # Pinned host memory side by side: alloc_bench's host workload (cachalot, cudaHostAlloc, PyTorch) and the
  # H2D pipeline through PyTorch, native against cachalot's host cache.
  (cd /tmp && "$root/build-gpu/tools/alloc_bench" -w host -a cachalot,cudaHostAlloc,PyTorch --pin 2 \
    --csv "$out/alloc-bench-host.csv") 2>&1 | tee "$out/alloc-bench-host.log" || rc=1
  (cd /tmp && PYTHONUNBUFFERED=1 python3 "$root/tests/gpu/host_bench.py" "$out/host-bench.json") 2>&1 |
    tee "$out/host-bench.log" || rc=1
  # PyTorch as the reference: the same allocation sequence must give the same memory_stats.
  PYTHONUNBUFFERED=1 python3 tests/gpu/torch_compare.py build-gpu/libcachalot.so.0 "${TORCH_COMPARE_OPS:-3000}" 2>&1 |
    tee "$out/torch-compare.log" || rc=1
  # PyTorch's own viewer must render cachalot's snapshots.
  PYTHONUNBUFFERED=1 python3 tests/gpu/torch_viz_check.py build-gpu/libcachalot.so.0 "$out/viz" build-gpu/tools/alloc_snapshot 2>&1 |
    tee "$out/torch-viz.log" || rc=1
  # The pluggable route: a model trains bit-identically to the native allocator; torch.cuda.graph works.
  (cd /tmp && PYTHONUNBUFFERED=1 python3 "$root/tests/gpu/torch_plugin_test.py" "$root/build-gpu" "${TORCH_PLUGIN_STEPS:-50}") 2>&1 |
    tee "$out/torch-plugin.log" || rc=1
  # Two processes, one per GPU, NCCL data parallel through the backend (skipped, 77, with fewer than 2 GPUs).
  (cd /tmp && PYTHONUNBUFFERED=1 python3 "$root/tests/gpu/torch_ddp_test.py" "$root/build-gpu" "${TORCH_DDP_STEPS:-30}") 2>&1 |
    tee "$out/torch-ddp.log"
  ddp=${PIPESTATUS[0]}
  [ "$ddp" -eq 0 ] || [ "$ddp" -eq 77 ] || rc=1
fi
if [[ $parts == *,suite,* ]]; then
  tests_dir=${PYTORCH_TESTS:-$root/.pytorch-tests}
  if [ ! -f "$tests_dir/test_cuda.py" ]; then
    echo "suite: skipped: no PyTorch test files in $tests_dir (tests/gpu/pytorch_suite.py says how to get them)" |
      tee "$out/pytorch-suite.log"
  else
    if ! (cd /tmp && python3 -c 'import cachalot.torch' 2>/dev/null); then
      PYTHONPATH="$root/.device/py" python3 -m pip install -q --no-build-isolation --no-index \
        -Csetup-args=-Ddeps_dir=.device "$root" >"$out/pip-install.log" 2>&1 || { tail -30 "$out/pip-install.log"; rc=1; }
    fi
    (cd /tmp && PYTHONUNBUFFERED=1 python3 "$root/tests/gpu/pytorch_suite.py" "$tests_dir" "$out/pytorch-suite" \
      --files "${PYTORCH_SUITE_FILES:-test_cuda.py,test_cuda_expandable_segments.py,test_cuda_trace.py,test_cuda_multigpu.py}" \
      --modes "${PYTORCH_SUITE_MODES:-native,cachalot}") 2>&1 | tee "$out/pytorch-suite.log" || rc=1
  fi
fi
exit $rc
