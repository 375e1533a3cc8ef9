#!/usr/bin/env python3
"""Interoperability of fusedopt's safetensors I/O with the reference `safetensors` package.

Usage: check_with_safetensors.py FIXTURE_EXE TMPDIR

1. FIXTURE_EXE writes files of splitmix64 values; we load them with the reference library
   and compare bit for bit with the same values regenerated here.
2. We write a file with safetensors.numpy.save_file; FIXTURE_EXE --read lists it, and we
   compare names, dtypes, shapes, FNV-1a checksums and metadata.

Missing packages are a failure, not a skip: scripts/deps.sh installs them.
"""
import os
import random
import subprocess
import sys

try:
    import numpy as np
    import safetensors
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file
except ImportError as e:
    print(f"FAIL: {e}; run scripts/deps.sh (python3 -m pip install safetensors numpy)")
    sys.exit(1)

MASK = (1 << 64) - 1
NOTE = 'caf\u00e9 \u20ac "quoted" back\\slash \U0001F600'


class SplitMix64:
    def __init__(self, seed):
        self.state = seed & MASK

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)


def expected_tensors(seed):
    """The fixture's tensors; BF16 as raw uint16 bits (numpy has no bfloat16)."""
    rng = SplitMix64(seed)
    f32 = [(rng.next() >> 40) * 2.0**-22 - 2.0 for _ in range(12)]
    f16 = [((rng.next() >> 53) - 1024) / 256 for _ in range(10)]
    bf16 = [((rng.next() >> 56) - 128) / 16 for _ in range(12)]
    i64 = [rng.next() for _ in range(7)]
    scalar = (rng.next() >> 40) * 2.0**-22 - 2.0
    bf16_bits = (np.array(bf16, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return {
        "f32": np.array(f32, dtype=np.float32).reshape(3, 4),
        "f16": np.array(f16, dtype=np.float16).reshape(5, 2),
        "bf16": bf16_bits.reshape(2, 3, 2),
        "i64": np.array(i64, dtype=np.uint64).view(np.int64).reshape(7),
        "scalar": np.array(scalar, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.int64),
    }


failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def same(name, got, want):
    check(got.dtype == want.dtype, f"{name}: dtype {got.dtype} != {want.dtype}")
    check(got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}")
    check(got.tobytes() == want.tobytes(), f"{name}: values differ")


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & MASK
    return h


def cpp_writes_python_reads(exe, tmp, seed):
    want = expected_tensors(seed)
    meta = {"seed": str(seed), "generator": "splitmix64", "note": NOTE}

    # Every dtype, BF16 included, through the reference parser's raw view.
    full = os.path.join(tmp, "from_cpp.safetensors")
    subprocess.run([exe, str(seed), full], check=True)
    with open(full, "rb") as f:
        raw = dict(safetensors.deserialize(f.read()))
    check(sorted(raw) == sorted(want), f"tensor names {sorted(raw)}")
    dtypes = {"f32": "F32", "f16": "F16", "bf16": "BF16", "i64": "I64", "scalar": "F32",
              "empty": "I64"}
    for name, w in want.items():
        r = raw[name]
        check(r["dtype"] == dtypes[name], f"{name}: dtype {r['dtype']}")
        check(list(r["shape"]) == list(w.shape), f"{name}: shape {r['shape']}")
        check(bytes(r["data"]) == w.tobytes(), f"{name}: bytes differ")
    with safe_open(full, framework="np") as f:
        check(written_metadata(f.metadata()) == meta, f"metadata {f.metadata()!r}")
        check(sorted(f.keys()) == sorted(want), f"keys {f.keys()}")

    # numpy arrays through load_file (which cannot represent BF16, hence the second file).
    no_bf16 = os.path.join(tmp, "from_cpp_no_bf16.safetensors")
    subprocess.run([exe, str(seed), no_bf16, "--no-bf16"], check=True)
    loaded = load_file(no_bf16)
    check(sorted(loaded) == sorted(k for k in want if k != "bf16"), f"names {sorted(loaded)}")
    for name, got in loaded.items():
        same(name, got, want[name])
    with safe_open(no_bf16, framework="np") as f:
        check(written_metadata(f.metadata()) == meta, f"metadata {f.metadata()!r}")


def written_metadata(metadata):
    """The caller's metadata: fusedopt adds the XXH3-64 of the whole file (16 hex digits),
    which the C++ tests check against the bytes; here only its presence and form."""
    rest = dict(metadata)
    digest = rest.pop("fusedopt_xxh3_64", "")
    check(len(digest) == 16 and all(c in "0123456789abcdef" for c in digest),
          f"file checksum {digest!r}")
    return rest


def python_writes_cpp_reads(exe, tmp, seed):
    rng = np.random.default_rng(seed)
    tensors = {
        "w.f32": rng.standard_normal((4, 5)).astype(np.float32),
        "w.f16": rng.standard_normal(9).astype(np.float16),
        "w.f64": rng.standard_normal((2, 1, 3)),
        "step": np.array(int(rng.integers(1, 10**6)), dtype=np.int64),
        "ids": rng.integers(-(2**40), 2**40, size=6, dtype=np.int64),
        "mask": rng.integers(0, 256, size=11, dtype=np.uint8),
        "none": np.zeros((3, 0), dtype=np.float32),
    }
    meta = {"format": "np", "epoch": str(seed % 97), "note": "caf\u00e9 \u20ac"}
    path = os.path.join(tmp, "from_python.safetensors")
    save_file(tensors, path, metadata=meta)
    out = subprocess.run([exe, "--read", path], check=True, capture_output=True).stdout
    got = out.decode("utf-8").splitlines()
    dtype_names = {np.float32: "F32", np.float16: "F16", np.float64: "F64", np.int64: "I64",
                   np.uint8: "U8"}
    want = [f"meta {k} {meta[k]}" for k in sorted(meta)]
    for name in sorted(tensors):
        t = tensors[name]
        shape = "[" + ",".join(str(d) for d in t.shape) + "]"
        want.append(f"tensor {name} {dtype_names[t.dtype.type]} {shape} "
                    f"{fnv1a64(t.tobytes()):016x}")
    check(got == want, "fixture --read output:\n  " + "\n  ".join(got) +
          "\nexpected:\n  " + "\n  ".join(want))


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    exe, tmp = sys.argv[1], sys.argv[2]
    os.makedirs(tmp, exist_ok=True)
    seed = random.SystemRandom().getrandbits(64)  # fresh data each run; printed for replay
    print(f"seed {seed}, safetensors {safetensors.__version__}, numpy {np.__version__}")
    cpp_writes_python_reads(exe, tmp, seed)
    python_writes_cpp_reads(exe, tmp, seed)
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
