"""Check tcpy's float32 math functions (`tcpy.codegen.vector_math`) against glibc's
float64 ones: the largest error in ULPs, every special value (NaN, infinities, signed
zeros, overflow and underflow) exactly, and the same bits from a vectorised loop as
from scalar code.

    python tools/check_vector_math.py --exhaustive      # all 2^32 inputs (minutes)
    python tools/check_vector_math.py                   # a stratified sample

The functions are compiled twice with the kernels' flags, once in a `#pragma omp simd`
loop and once with vectorisation off; the check runs on every core (OpenMP). A sample
takes, for each sign and exponent, the smallest, the largest and random mantissas, and
every input within a few thousand ULPs of the places where a function changes method
(and its overflow and underflow bounds). Prints one JSON line per function; exits 1
when a function breaks its documented bound (`ERROR_ULPS`) or a special value.
"""

from __future__ import annotations

import argparse
import json
import random
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tcpy.codegen import vector_math
from tcpy.runtime import cpu

_CHECKER = r"""
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void run_vector(const float *in, float *out, long n);
void run_scalar(const float *in, float *out, long n);

static float as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t as_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* the error of y in ULPs of the float32 result nearest ref; -1: a special value
   (NaN, an infinity, a zero's sign, overflow) differs */
static double ulps(float y, double ref) {
  float rf = (float)ref;
  if (isnan(ref)) return isnan(y) ? 0.0 : -1.0;
  if (isnan(y)) return -1.0;
  if (isinf(rf) || isinf(y)) return y == rf ? 0.0 : -1.0;
  if (ref == 0.0) return y == 0.0f && !signbit(y) == !signbit(ref) ? 0.0 : -1.0;
  if (y == 0.0f && rf == 0.0f && !signbit(y) != !signbit(ref)) return -1.0;
  int e;
  frexp(ref, &e);  /* |ref| in [2^(e-1), 2^e) */
  double ulp = ldexp(1.0, e - 24 < -149 ? -149 : e - 24);
  return fabs((double)y - ref) / ulp;
}

#define BLOCK 4096

int main(int argc, char **argv) {
  /* stdin: lines "first count" of input bit patterns (count up to 2^32) */
  static uint64_t first[1 << 20], count[1 << 20];
  int ranges = 0;
  while (ranges < (1 << 20) && scanf("%%lu %%lu", &first[ranges], &count[ranges]) == 2) ranges++;
  double worst = 0.0; uint32_t worst_at = 0;
  long specials = 0, differ = 0, checked = 0;
  uint32_t special_at = 0, differ_at = 0;
  static uint64_t before[(1 << 20) + 1];  /* inputs in the runs before each run */
  for (int r = 0; r < ranges; r++) before[r + 1] = before[r] + count[r];
  long blocks = (long)((before[ranges] + BLOCK - 1) / BLOCK);
  #pragma omp parallel for schedule(dynamic, 16) reduction(+:specials, differ, checked)
  for (long b = 0; b < blocks; b++) {
    float in[BLOCK], vec[BLOCK], sca[BLOCK];
    uint64_t g = (uint64_t)b * BLOCK;
    long n = (long)(before[ranges] - g < BLOCK ? before[ranges] - g : BLOCK);
    int r = 0;
    for (long i = 0; i < n; i++, g++) {
      while (before[r + 1] <= g) r++;
      in[i] = as_float((uint32_t)(first[r] + (g - before[r])));
    }
    run_vector(in, vec, n);
    run_scalar(in, sca, n);
    double w = 0.0; uint32_t w_at = 0;
    for (long i = 0; i < n; i++) {
      if (as_bits(vec[i]) != as_bits(sca[i])) {
        differ++;
        #pragma omp critical
        differ_at = as_bits(in[i]);
      }
      double e = ulps(vec[i], %(reference)s((double)in[i]));
      if (e < 0) {
        specials++;
        #pragma omp critical
        special_at = as_bits(in[i]);
      } else if (e > w) { w = e; w_at = as_bits(in[i]); }
    }
    checked += n;
    #pragma omp critical
    if (w > worst) { worst = w; worst_at = w_at; }
  }
  printf("{\"checked\": %%ld, \"max_ulps\": %%.4f, \"max_at\": %%u, \"specials\": %%ld, "
         "\"special_at\": %%u, \"vector_scalar_differ\": %%ld, \"differ_at\": %%u}\n",
         checked, worst, worst_at, specials, special_at, differ, differ_at);
  return 0;
}
"""

_LOOPS = """
#include <stdint.h>
%(source)s
void run_%(kind)s(const float *restrict in, float *restrict out, long n) {
  #pragma omp simd
  for (long i = 0; i < n; i++) out[i] = %(c_name)s(in[i]);
}
"""

BOUNDARIES = {
    # where each function changes method, overflows, underflows or reaches its limit
    "exp": [0.0, 88.72, 88.7228, 89.0, -87.33, -103.97, -104.0, 0.3466, -0.3466],
    "log": [1.0, 0.70710677, 1.4142135, 2.0, 0.5, 2.0**-126, 2.0**-149, 3.4e38],
    "tanh": [0.0, 0.625, -0.625, 9.01, 9.5, 2.0**-126],
    "erf": [0.0, 1.0, -1.0, 3.92, -3.92, 3.9192, 2.0**-126],
}
_REFERENCE = {"exp": "exp", "log": "log", "tanh": "tanh", "erf": "erf"}


def _bits(x: float) -> int:
    return int(struct.unpack("<I", struct.pack("<f", x))[0])


def sample_ranges(name: str, per_exponent: int = 400, near: int = 2048) -> list[tuple[int, int]]:
    """Input bit patterns as (first, count) runs: per sign and exponent, both ends of the
    mantissa and `per_exponent` random mantissas; `near` patterns either side of each
    of `name`'s boundaries (and of both zeros, denormals included)."""
    rng = random.Random(f"tcpy-{name}")
    runs: list[tuple[int, int]] = []
    for sign in (0, 1):
        for exponent in range(256):
            base = (sign << 31) | (exponent << 23)
            runs += [(base, 2), (base + (1 << 23) - 2, 2)]
            runs += [(base + rng.randrange(1 << 23), 1) for _ in range(per_exponent)]
    for x in BOUNDARIES[name] + [0.0]:
        for v in (x, -x):
            b = _bits(v)
            lo = max(b - near, b & 0x80000000)
            runs.append((lo, min(b + near, (b & 0x80000000) | 0x7FFFFFFF) - lo + 1))
    return runs


def check(name: str, exhaustive: bool, workdir: Path) -> dict[str, float]:
    """Build the checker of `name` and run it; its JSON result."""
    c_name = vector_math.c_name(name)
    text = vector_math.source({name})
    sources = {
        "main.c": _CHECKER % {"reference": _REFERENCE[name]},
        "vector.c": _LOOPS % {"source": text, "kind": "vector", "c_name": c_name},
        "scalar.c": _LOOPS % {"source": text, "kind": "scalar", "c_name": c_name},
    }
    for file, body in sources.items():
        (workdir / file).write_text(body)
    flags = [f for f in cpu.flags() if f not in ("-shared", "-fPIC", "-w")]
    objects = []
    for file, extra in (("vector.c", []), ("scalar.c", ["-fno-tree-vectorize"]), ("main.c", [])):
        obj = workdir / file.replace(".c", ".o")
        cmd = [cpu.compiler(), *flags, *extra, "-c", "-o", str(obj), str(workdir / file)]
        subprocess.run(cmd, check=True)
        objects.append(str(obj))
    exe = workdir / f"check_{name}"
    link = [cpu.compiler(), "-fopenmp", "-o", str(exe), *objects, "-lm"]
    subprocess.run(link, check=True)
    runs = [(0, 1 << 32)] if exhaustive else sample_ranges(name)
    stdin = "".join(f"{a} {n}\n" for a, n in runs)
    done = subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exhaustive", action="store_true", help="all 2^32 inputs")
    parser.add_argument("--only", default=",".join(sorted(vector_math.OWN)))
    args = parser.parse_args(argv)
    failed = False
    with tempfile.TemporaryDirectory(prefix="tcpy-vm-") as tmp:
        for name in args.only.split(","):
            result = check(name, args.exhaustive, Path(tmp))
            bound = vector_math.ERROR_ULPS[name]
            ok = (
                result["max_ulps"] <= bound
                and result["specials"] == 0
                and result["vector_scalar_differ"] == 0
            )
            failed = failed or not ok
            print(json.dumps({"function": name, "bound": bound, "ok": ok, **result}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
