"""Runs the C++ and the Python loader over a corpus and compares them.

    compare_loaders.py LOAD_FILES CORPUS_DIR

LOAD_FILES is fuzz/load_files.cpp built. The fuzzer only exercises the C++
loader; this gives its corpus (inputs that reach every check) to the Python
reader too (torchcap._load.load_in_python: what torchcap.load runs without the
compiled part). It fails if the Python loader raises anything but ValueError, or
if the two disagree on whether a file loads, except where they differ by design
(docs/FORMAT.md): Python cannot hold some attribute names C++ can, and leaves
most schema checks and the shape check to run time. Both refuse the arguments
kernels would not survive (Note [Integers kernels divide by]). Both run with
checksums off: the fuzzer's files fail them all, and the checks behind them are
what is compared.
"""

import collections
import pathlib
import re
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
import torchcap  # noqa: E402
import torchcap._load  # noqa: E402

PYTHON_ONLY = ("Python cannot hold this attribute",)
# Schema and shape checks only the C++ loader makes (Note [Checking a file's
# shapes] in src/serialize/shapes.cpp); in Python such a call fails when run.
CPP_ONLY = re.compile(r"expects .*, got |takes at most \d+ positional|is missing required "
                      r"argument|both positionally and by keyword|getitem index .* is out of "
                      r"range|getitem reads %|fails on the recorded shapes: | on the recorded "
                      r"shapes, but the file records |bytes of memory it views|gives a result "
                      r"that is not a strided tensor|on the recorded shapes\) into ")


def main(load_files, corpus):
    paths = sorted(str(p) for p in pathlib.Path(corpus).iterdir() if p.is_file())
    cpp = {}
    for start in range(0, len(paths), 500):
        out = subprocess.run([load_files, "--no-checksums"] + paths[start:start + 500], check=True,
                             capture_output=True, text=True, errors="replace").stdout
        # split("\n"), not splitlines(): messages quote file bytes, which may
        # hold other characters Python counts as line breaks.
        for line in out.split("\n"):
            if not line:
                continue
            verdict, path, *message = line.split(" ", 2)
            cpp[path] = (verdict, message[0] if message else "")
    problems = collections.Counter()
    examples = {}
    for path in paths:
        try:
            torchcap._load.load_in_python(path, verify_checksums=False)
            verdict, message = "OK", ""
        except ValueError as e:
            verdict, message = "ERR", str(e)
        except Exception as e:  # noqa: BLE001 -- any other exception is the finding
            key = f"Python raised {type(e).__name__}: {str(e)[:200]}"
            problems[key] += 1
            examples.setdefault(key, path)
            continue
        expected = any(p in message for p in PYTHON_ONLY) or (
            verdict == "OK" and CPP_ONLY.search(cpp[path][1]))
        if verdict != cpp[path][0] and not expected:
            key = f"C++ {cpp[path][0]} {cpp[path][1][len(path) + 2:][:120]!r} / " \
                  f"Python {verdict} {message[len(path) + 2:][:120]!r}"
            problems[key] += 1
            examples.setdefault(key, path)
    loaded = sum(1 for v, _ in cpp.values() if v == "OK")
    print(f"compare_loaders: {len(paths)} files, {loaded} load in C++, "
          f"{sum(problems.values())} disagreements")
    for key, n in problems.most_common():
        print(f"  {n} x {key}\n      e.g. {examples[key]}")
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
