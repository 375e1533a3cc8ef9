"""fusedopt-bench as a user meets it: its own --help, a case of the user's own (a shapes file
with fresh random shapes and mixed dtypes, a rule file and a preset, fused and one optimizer
per tensor) whose --json results carry bench/torch_step.py's fields, each checked against
what the shapes file says (tensors, elements, AdamW's bytes computed here by hand), and bad
input refused with exit code 2 and a message that says where.

  python3 check_bench.py PATH/TO/fusedopt-bench
"""
import json
import math
import os
import random
import subprocess
import sys
import tempfile

BENCH = sys.argv[1]
SIZE = {"fp32": 4, "bf16": 2, "fp16": 2}


def run(*args):
    return subprocess.run([BENCH, *args], capture_output=True, text=True, timeout=600)


def check(cond, what):
    if not cond:
        sys.exit(f"FAILED: {what}")


def main():
    r = run("--help")
    check(r.returncode == 0, f"--help exits 0, not {r.returncode}")
    for words in ("--workload", "--rule", "--mode", "--json", "floor_fraction", "copy_fraction",
                  "Google Benchmark's flags", "--benchmark_filter", "Examples:"):
        check(words in r.stdout, f"--help explains {words!r}")

    rng = random.Random()  # fresh shapes every run
    tensors = []
    for i in range(rng.randint(3, 6)):
        shape = [rng.randint(1, 64) for _ in range(rng.randint(1, 3))]
        tensors.append({"name": f"t{i}", "shape": shape, "dtype": rng.choice(list(SIZE))})
    with tempfile.TemporaryDirectory() as tmp:
        shapes = os.path.join(tmp, "model.json")
        with open(shapes, "w") as f:
            json.dump({"name": "random-model", "tensors": tensors}, f)
        rule = os.path.join(tmp, "heavy_ball.rule")
        with open(rule, "w") as f:
            f.write("param p\ngrad g\nstate m = 0\nhyper lr = 0.01\nm = 0.9 * m + g\n"
                    "p = p - lr * m\n")
        out = os.path.join(tmp, "out.json")
        r = run("--workload", shapes, "--rule", rule, "--preset", "adamw", "--mode", "both",
                "--json", out, "--benchmark_min_time=0.01")
        check(r.returncode == 0, f"the user's case runs (exit {r.returncode}): {r.stderr}")
        with open(out) as f:
            doc = json.load(f)
    check("machine" in doc and doc["machine"].get("fusedopt"), "the JSON names the machine")
    results = doc["results"]
    check(len(results) == 4, f"two rules x two modes: 4 results, not {len(results)}")
    elements = sum(math.prod(t["shape"]) for t in tensors)
    # AdamW with fp32 states, one pass: the param read and written, the grad read, m and v
    # read and written (4 bytes each).
    adamw_bytes = sum(math.prod(t["shape"]) * (3 * SIZE[t["dtype"]] + 16) for t in tensors)
    for res in results:
        for key in ("case", "what", "device", "seconds", "floor_seconds", "copy_seconds",
                    "bytes", "tensors", "elements", "launches"):
            check(key in res, f"{res.get('what')}: has {key}")
        what = res["what"]
        check(res["tensors"] == len(tensors), f"{what}: {len(tensors)} tensors")
        check(res["elements"] == elements, f"{what}: {elements} elements, not {res['elements']}")
        check(res["seconds"] > 0 and res["floor_seconds"] > 0 and res["copy_seconds"] > 0,
              f"{what}: the step and both floors measured")
        if "one optimizer per tensor" in what:
            check(res["launches"] >= len(tensors), f"{what}: a launch per tensor at least")
        if what.startswith("adamw"):
            check(res["bytes"] == adamw_bytes, f"{what}: {adamw_bytes} bytes, not {res['bytes']}")
    check({r["what"].split(" ")[0] for r in results} == {"adamw", "heavy_ball"},
          "both rules ran, the rule file under its own name")

    with tempfile.TemporaryDirectory() as tmp:
        bad = os.path.join(tmp, "bad.json")
        with open(bad, "w") as f:
            f.write('{"tensors": [\n  {"shape": [3, 0.5]}]}')
        for args, words in [(["--workload", "no-such-model"], "no workload 'no-such-model'"),
                            (["--workload", bad], "bad.json:2:17: error: a dimension"),
                            (["--preset", "adamw"], "give --workload too"),
                            (["--workload", "small-5000", "--mode", "sideways"], "--mode")]:
            r = run(*args)
            check(r.returncode == 2, f"{args}: exit 2, not {r.returncode}")
            check(words in r.stderr, f"{args}: says {words!r}, not {r.stderr!r}")
    print("fusedopt-bench: help, a user's case, --json and bad input all as documented")


main()
