#!/usr/bin/env python3
"""Checks the CTest shards of the doctest executables (tests/CMakeLists.txt, fusedopt_shard).

The spec file (written by CMake) has one line per CTest test that runs a doctest executable:
    <group> TAB <kind> TAB <test name> TAB <executable> [TAB <doctest filter>]...
kind "part": the group's parts together run every case of the executable, each exactly once
(a group is one configuration: the main and extended shards of a suite); kind "variant": the
same cases again in another setting (more ranks, other compiler flags), a subset, not empty.

For every executable: each case's suite is the name of the tests/ folder its file lives in;
each group of parts covers every case once (a case that falls out of every shard, or runs in
two, fails this check, naming it); and no test selects nothing. Exit 1 on any failure.
"""
import collections
import os
import subprocess
import sys
import xml.etree.ElementTree as ET


def list_cases(exe, filters):
    """The (file, line, name, suite) of every case `filters` select, skipped ones too."""
    out = subprocess.run([exe, "--list-test-cases", "--reporters=xml", "--no-skip", *filters],
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"{exe} --list-test-cases exited {out.returncode}:\n{out.stderr}")
    root = ET.fromstring(out.stdout[out.stdout.index("<"):])
    return [(os.path.normpath(c.get("filename")), int(c.get("line")), c.get("name"),
             c.get("testsuite")) for c in root.iter("TestCase")]


def main(spec_path):
    groups = collections.OrderedDict()
    with open(spec_path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            group, kind, test, exe, *filters = line.rstrip("\n").split("\t")
            groups.setdefault((exe, group), []).append((kind, test, filters))
    errors = []
    whole = {}
    for exe in sorted({exe for exe, _ in groups}):
        whole[exe] = list_cases(exe, [])
        for file, line, name, suite in whole[exe]:
            folder = os.path.basename(os.path.dirname(file))
            if suite != folder:
                errors.append(f"{file}:{line}: case '{name}' is in suite '{suite}', not "
                              f"'{folder}' (suite names are the tests/ folders)")
    for exe in whole:
        if not any(kind == "part" for (e, _), tests in groups.items() if e == exe
                   for kind, _, _ in tests):
            errors.append(f"{exe}: no group of parts runs every case")
    for (exe, group), tests in groups.items():
        everything = collections.Counter(whole[exe])
        seen = collections.Counter()
        kinds = {kind for kind, _, _ in tests}
        for kind, test, filters in tests:
            cases = list_cases(exe, filters)
            if not cases:
                errors.append(f"CTest test {test} selects no case of {exe}")
            if kind == "part":
                seen.update(cases)
        if "part" not in kinds:
            continue
        for case in everything:
            file, line, name, _ = case
            if seen[case] == 0:
                errors.append(f"{file}:{line}: case '{name}' runs in no CTest test of group "
                              f"{group}")
            elif seen[case] > 1:
                errors.append(f"{file}:{line}: case '{name}' runs {seen[case]} times in group "
                              f"{group}")
    parts = sum(1 for tests in groups.values() for kind, _, _ in tests if kind == "part")
    cases = sum(len(c) for c in whole.values())
    for e in errors:
        print(e)
    print(f"shards: {cases} cases of {len(whole)} executables, {parts} part tests in "
          f"{sum(1 for t in groups.values() if any(k == 'part' for k, _, _ in t))} groups: "
          f"{'FAILED' if errors else 'each case once'}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
