#!/usr/bin/env bash
# The GPU checks in one call on a lent GPU machine (bare, no network): the `gpu` tests
# with both driver layers, `bench/gpu.py` and `bench/gpu_variants.py`. Run from the
# repository's root.
#
#   bench/gpu_check.sh [tests|bench|all] [extra pytest -k expression]
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
if [ -d .whl/pycuda-built ]; then
    cp -r .whl/pycuda-built /tmp/pycuda
else
    (build_pycuda > "$OUT/pycuda-build.log" 2>&1; echo "rc=$?" >> "$OUT/pycuda-build.log") &
fi
builder=${!:-}

run_tests() {  # $1: driver, $2: seconds
    local k="$1"
    [ -n "$filter" ] && k="$k and ($filter)"
    timeout "$2" python3 -m pytest -m gpu -k "$k" -n 12 -q -p no:cacheprovider \
        --tb=short -rfE tests/test_gpu.py tests/test_empty.py > "$OUT/tests-$1.log" 2>&1
    echo "tests $1: rc=$?"; tail -n 3 "$OUT/tests-$1.log"
}

if [ "$what" != bench ]; then
    run_tests bindings "${TEST_SECONDS:-180}"
fi
if [ "$what" != tests ]; then
    timeout "${BENCH_SECONDS:-170}" python3 bench/gpu.py --reps 30 --out "$OUT" ${BENCH_ARGS:-} \
        > "$OUT/bench.log" 2>&1
    echo "bench: rc=$?"; tail -n 2 "$OUT/bench.log"
    timeout "${VARIANT_SECONDS:-90}" python3 bench/gpu_variants.py --out "$OUT" \
        > "$OUT/variants.log" 2>&1
    echo "variants: rc=$?"; tail -n 1 "$OUT/variants.log"
fi
if [ "$what" != bench ]; then
    wait "$builder" 2>/dev/null
    tail -n 3 "$OUT/pycuda-build.log" 2>/dev/null
    if python3 -c "import sys; sys.path.insert(0, '/tmp/pycuda'); import pycuda.driver"; then
        [ -d "$root/.whl/pycuda-built" ] || (cd /tmp && tar czf "$OUT/pycuda-built.tgz" pycuda)
        PYTHONPATH=/tmp/pycuda:$PYTHONPATH run_tests pycuda "${TEST_SECONDS:-180}"
    fi
fi
