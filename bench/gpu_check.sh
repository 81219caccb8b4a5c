#!/usr/bin/env bash
# The GPU checks in one call on a lent GPU machine (bare, no network): the `gpu` tests
# with both driver layers, `bench/gpu.py` (float32, then the memory-bound kernels in
# bfloat16, then the contractions with `copy_stages` 1 beside the pipelined default, then
# the contractions on the tensor cores: bfloat16, float16, tf32 and tf32x3),
# `bench/overhead.py --gpu` (host time per call), `bench/gpu_variants.py`,
# forward + backward
# of `bench/autodiff.py` on CUDA tensors, `bench/bert.py --device cuda` (the BERT layer
# per block and as one def, the layer also as one kernel, float32 and bfloat16), and the
# differential and gradient fuzzers on
# the `cuda` target (beside the pycuda tests, which need no timing). Run from the
# repository's root.
#
#   bench/gpu_check.sh [tests|bench|all] [extra pytest -k expression]
#
# A phase whose *_SECONDS is 0 is skipped; FUZZ_ARGS go to the differential fuzzer
# (`--float-type half`, say), BENCH_ARGS to `bench/gpu.py` and BERT_ARGS to `bench/bert.py`
# (`--only layer,attention`, say).
#
# Wheels the machine lacks travel in .whl/ (islpy, lark, deap and their needs, and the
# pycuda sdist, which is built there: PyPI has no pycuda wheel). Logs and results go to
# $OUT (default: bench/results/gpu-check).
set -u
what=${1:-all}
filter=${2:-}
OUT=${OUT:-bench/results/gpu-check}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 TCPY_CACHE_DIR=/tmp/tcpy-gpu-cache
root=$PWD

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$root
# NVRTC before 13.4 miscompiles some kernels, and tcpy then builds them unoptimised
# (tcpy/runtime/nvrtc.py): a newer libnvrtc in .whl/nvrtc (xz-compressed, see
# CONTRIBUTING.md) is loaded first, before the machine's own
if ls .whl/nvrtc/libnvrtc.so.13.xz > /dev/null 2>&1; then
    mkdir -p /tmp/nvrtc && for f in .whl/nvrtc/*.xz; do xz -dc "$f" > "/tmp/nvrtc/$(basename "$f" .xz)"; done
    export LD_LIBRARY_PATH=/tmp/nvrtc:${LD_LIBRARY_PATH:-} LD_PRELOAD=/tmp/nvrtc/libnvrtc.so.13
fi
python3 -c "from tcpy.runtime import nvrtc; print('NVRTC', nvrtc.version(), nvrtc.identity())"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu \
    --format=csv
python3 -c "import sys, numpy, torch, cuda.bindings; print(sys.version, numpy.__version__,
torch.__version__, cuda.bindings.__version__)"

# pycuda, built in the background while the cuda.bindings tests run
build_pycuda() {
    rm -rf /tmp/pycuda && mkdir -p /tmp/pycuda && cd /tmp/pycuda || return 1
    tar xzf "$root"/.whl/pycuda-*.tar.gz --strip-components=1 || return 1
    python3 configure.py --cuda-root=/usr/local/cuda --no-cuda-enable-curand \
        --cudadrv-lib-dir=/usr/local/cuda/lib64/stubs,/usr/local/cuda/lib64,/usr/lib/x86_64-linux-gnu,/usr/local/nvidia/lib64 \
        && python3 setup.py build_ext --inplace -j 8
}
if [ -f .whl/pycuda-built.tgz ]; then  # a build from an earlier session's $OUT
    rm -rf /tmp/pycuda && (cd /tmp && tar xzf "$root"/.whl/pycuda-built.tgz)
else
    (build_pycuda > "$OUT/pycuda-build.log" 2>&1; echo "rc=$?" >> "$OUT/pycuda-build.log") &
fi
builder=${!:-}

run_tests() {  # $1: driver, $2: seconds; tests not parametrised by driver run with bindings
    local k="$1"
    [ "$1" = bindings ] && k="not pycuda"
    [ -n "$filter" ] && k="$k and ($filter)"
    timeout "$2" python3 -m pytest -m gpu -k "$k" -n 12 -q -p no:cacheprovider \
        --tb=short -rfE tests/test_gpu.py tests/test_gpu_async.py tests/test_empty.py \
        tests/test_torch_ops.py tests/test_half.py tests/test_emulator_sm80.py \
        tests/test_tensor_cores.py \
        > "$OUT/tests-$1.log" 2>&1
    echo "tests $1: rc=$?"; tail -n 3 "$OUT/tests-$1.log"
}

if [ "$what" != bench ]; then
    run_tests bindings "${TEST_SECONDS:-180}"
fi
if [ "$what" != tests ]; then
    if [ "${BENCH_SECONDS:-170}" != 0 ]; then
        # shellcheck disable=SC2086
        timeout "${BENCH_SECONDS:-170}" python3 bench/gpu.py --reps 30 --out "$OUT" \
            ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
        echo "bench: rc=$?"; tail -n 2 "$OUT/bench.log"
    fi
    if [ "${HALF_SECONDS:-90}" != 0 ]; then  # the memory-bound suite in bfloat16
        timeout "${HALF_SECONDS:-90}" python3 bench/gpu.py --type bfloat16 --reps 30 \
            --only softmax,layernorm,gelu,bias_add_grad,maxpool --no-torch-compile \
            --out "$OUT" > "$OUT/half.log" 2>&1
        echo "half: rc=$?"; tail -n 2 "$OUT/half.log"
    fi
    if [ "${STAGES_SECONDS:-90}" != 0 ]; then  # the contractions, pipelined or not
        timeout "${STAGES_SECONDS:-90}" python3 bench/gpu.py --reps 20 --no-torch-compile \
            --only matmul,matmul_transposed,batch_matmul,mlp --variant '{"copy_stages": 1}' \
            --tag stages --out "$OUT" > "$OUT/stages.log" 2>&1
        echo "stages: rc=$?"; tail -n 1 "$OUT/stages.log"
    fi
    if [ "${MATRIX_SECONDS:-160}" != 0 ]; then  # the contractions on the tensor cores
        for kind in "--type bfloat16" "--type float16" "--input-precision tf32" \
            "--input-precision tf32x3"; do
            # shellcheck disable=SC2086
            timeout $(( ${MATRIX_SECONDS:-160} / 4 )) python3 bench/gpu.py --reps 20 \
                --no-torch-compile --only matmul,batch_matmul,mlp,conv2d $kind \
                --tag matrix --out "$OUT" >> "$OUT/matrix.log" 2>&1
            echo "matrix $kind: rc=$?"
        done
        tail -n 1 "$OUT/matrix.log"
    fi
    if [ "${OVERHEAD_SECONDS:-60}" != 0 ]; then  # host time per call, beside the peers
        timeout "${OVERHEAD_SECONDS:-60}" python3 bench/overhead.py --gpu --out "$OUT" \
            > "$OUT/overhead.log" 2>&1
        echo "overhead: rc=$?"; tail -n 9 "$OUT/overhead.log"
    fi
    if [ "${VARIANT_SECONDS:-90}" != 0 ]; then
        timeout "${VARIANT_SECONDS:-90}" python3 bench/gpu_variants.py --out "$OUT" \
            > "$OUT/variants.log" 2>&1
        echo "variants: rc=$?"; tail -n 1 "$OUT/variants.log"
    fi
    if [ "${AUTODIFF_SECONDS:-90}" != 0 ]; then
        timeout "${AUTODIFF_SECONDS:-90}" python3 bench/autodiff.py --device cuda --no-train \
            --no-compile --tag cuda --out "$OUT" > "$OUT/autodiff.log" 2>&1
        echo "autodiff: rc=$?"; tail -n 3 "$OUT/autodiff.log"
    fi
    if [ "${BERT_SECONDS:-150}" != 0 ]; then  # the BERT layer, per block and whole
        # shellcheck disable=SC2086
        timeout "${BERT_SECONDS:-150}" python3 bench/bert.py --device cuda --batches 1 \
            --tag cuda --out "$OUT" ${BERT_ARGS:-} > "$OUT/bert.log" 2>&1
        echo "bert: rc=$?"; tail -n 13 "$OUT/bert.log"
    fi
fi
fuzz() {  # $1: log name, then the fuzzer's arguments; every case a fresh process
    timeout "${FUZZ_SECONDS:-150}" python3 -m tools.fuzz --target cuda "${@:2}" \
        --run-timeout 30 --shrink-seconds 0 --out "$OUT/fuzz-$1" > "$OUT/fuzz-$1.log" 2>&1
    echo "fuzz $1: rc=$?"; tail -n 1 "$OUT/fuzz-$1.log"
}
if [ "$what" != bench ]; then
    if [ "${FUZZ_SECONDS:-150}" != 0 ]; then
        fuzz gradient --gradient --n "${FUZZ_N:-600}" --seed 9501 --jobs 6 &
        fuzz differential --n "${FUZZ_N:-600}" --seed 9601 --jobs 4 ${FUZZ_ARGS:-} &
    fi
    wait "$builder" 2>/dev/null
    tail -n 3 "$OUT/pycuda-build.log" 2>/dev/null
    if python3 -c "import sys; sys.path.insert(0, '/tmp/pycuda'); import pycuda.driver"; then
        [ -f "$root/.whl/pycuda-built.tgz" ] || (cd /tmp && tar czf "$OUT/pycuda-built.tgz" pycuda)
        PYTHONPATH=/tmp/pycuda:$PYTHONPATH run_tests pycuda "${TEST_SECONDS:-180}"
    fi
    wait
fi
