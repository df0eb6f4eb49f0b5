"""Runs the C++ and the Python loaders over a corpus and compares them.

    compare_loaders.py [--call] LOAD_FILES CORPUS_DIR

LOAD_FILES is fuzz/load_files.cpp built. The fuzzers drive the C++ loader;
this gives their corpus (inputs that reach every check) to the Python loaders
too: the reader without the compiled part (torchcap._load.load_in_python) and,
with --call, torchcap.load with it. Both run with checksums off: the fuzzers'
files fail them all, and the checks behind them are what is compared.

It fails if

- the reader without the compiled part raises anything but FormatError, or
  disagrees with the C++ loader on whether a file loads, except where they
  differ by design (docs/FORMAT.md): Python cannot hold some attribute names
  C++ can, and that reader checks operator schemas only by running each
  operator on meta tensors, which fails where the schema check would;

with --call, also if

- torchcap.load (the compiled part: the C++ loader in this process, where
  torch's meta kernels written in Python replace some of LibTorch's) gives
  another verdict than the C++ loader, or raises anything but FormatError;
- calling a module it loaded, on inputs of its placeholders' recorded shapes,
  raises anything but a torchcap.Error (a bare LibTorch error: a file the
  load-time checks should have refused, Note [Checking a file's shapes]), or
  does not return within TIMEOUT seconds;
- the module the reader without the compiled part made hangs, or fails where
  the compiled module ran.

Calls run in a worker process, one file at a time, so that a hang is seen
and the worker replaced.
"""

import collections
import json
import os
import pathlib
import re
import select
import subprocess
import sys

TIMEOUT = 20  # seconds for one file's loads and calls
PYTHON_ONLY = ("Python cannot hold this attribute",)
# Schema checks only the C++ loader makes; the reader without the compiled
# part finds such a call when its operator fails on meta tensors, or, in a
# node that records no value, not at all (it fails when the module runs).
CPP_ONLY = re.compile(r"expects .*, got |takes at most \d+ positional|is missing required "
                      r"argument|both positionally and by keyword|getitem index .* is out of "
                      r"range|getitem reads %")
# torch's meta kernels written in Python check more than some of LibTorch's
# C++ ones, or exist where LibTorch has none (where's predicate dtype and
# broadcasting, embedding_bag's dtypes, a convolution's channels, which
# results of native_batch_norm_backward its mask leaves out): in a Python
# process the shape check refuses some hostile files that the C++ loader's
# process loads (and most of which then fail there when run). The other way
# round, Python accepting what C++ refuses, is a disagreement.
STRICTER_IN_PYTHON = re.compile(r" fails on the recorded shapes: | on the recorded shapes, but ")
# Findings of the C++ Interpreter not fixed yet (fuzz/harness.cpp's
# kKnownFindings): a call that ends in one is not counted.
KNOWN = ("value cannot be converted to type float without overflow",)


def cpp_verdicts(load_files, paths):
    verdicts = {}
    for start in range(0, len(paths), 500):
        out = subprocess.run([load_files, "--no-checksums"] + paths[start:start + 500], check=True,
                             capture_output=True, text=True, errors="replace").stdout
        # split("\n"), not splitlines(): messages quote file bytes, which may
        # hold other characters Python counts as line breaks.
        for line in out.split("\n"):
            if not line:
                continue
            verdict, path, *message = line.split(" ", 2)
            verdicts[path] = (verdict, message[0] if message else "")
    return verdicts


# --- The worker: loads and calls, one file per request ----------------------------

def recorded_inputs(metas, torch):
    """Inputs of the placeholders' recorded dtypes and shapes (random floats,
    zeros elsewhere, as fuzz/harness.cpp makes them), or None if one has
    none."""
    inputs = []
    for i, meta in enumerate(metas):
        if meta is None or None in meta[1]:
            return None
        dtype, sizes = meta[0], meta[1]
        g = torch.Generator().manual_seed(i)
        try:
            inputs.append(torch.randn(sizes, generator=g).to(dtype) if dtype.is_floating_point
                          else torch.zeros(sizes, dtype=dtype))
        except (RuntimeError, TypeError):
            return None  # no such tensor can be made here (a quantized dtype)
    return inputs


def call(gm, args, kwargs, torchcap):
    """(outcome, detail): ok, error (a torchcap.Error), known, or bare."""
    try:
        gm(*args, **kwargs)
        return "ok", ""
    except torchcap.Error as e:
        return "error", str(e)[:300]
    except Exception as e:  # noqa: BLE001 -- any other exception is the finding
        text = f"{type(e).__name__}: {str(e)[:300]}"
        return ("known" if any(k in text for k in KNOWN) else "bare"), text


def worker():
    import resource
    import warnings
    warnings.simplefilter("ignore")
    # As load_fuzz_smoke: a mutant's huge allocation fails, with an error.
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    import torch
    import torch.utils._pytree as pytree
    torch.set_num_threads(1)
    import torchcap
    import torchcap._load
    from torchcap import _bridge
    for line in sys.stdin:
        path, run = line.rstrip("\n").split("\t")
        report = {"path": path}
        inputs = None
        for name, load in (("compiled", torchcap.load), ("python", torchcap._load.load_in_python)):
            try:
                gm = load(path, verify_checksums=False)
                report[name] = ["OK", ""]
            except torchcap.FormatError as e:
                report[name] = ["ERR", str(e)]
                continue
            except Exception as e:  # noqa: BLE001 -- the finding
                report[name] = ["RAISED", f"{type(e).__name__}: {str(e)[:300]}"]
                continue
            if name == "compiled" and run == "1":
                # From the C++ module: the torch.fx graph is not made, so
                # the call runs as a user's first call does.
                inputs = recorded_inputs(gm._torchcap_graph.placeholder_metas(), torch)
                if inputs is not None:
                    # The call's leaves: the tensors where the file's
                    # structure has them, its constants elsewhere.
                    graph = gm._torchcap_graph
                    args, kwargs, tensor_leaves = _bridge._example_call(
                        graph.fx_specs(_bridge._Spec)[0], graph.call_keywords())
                    leaves, spec = pytree.tree_flatten((args, kwargs))
                    given = iter(inputs)
                    structure = (spec, [next(given) if tensor else leaf
                                        for leaf, tensor in zip(leaves, tensor_leaves)])
            if inputs is not None:
                torch.manual_seed(0)
                spec, leaves = structure
                leaves = [t.clone() if isinstance(t, torch.Tensor) else t for t in leaves]
                report[name + "_call"] = call(gm, *pytree.tree_unflatten(leaves, spec), torchcap)
        print(json.dumps(report), flush=True)


class Worker:
    def __init__(self):
        self.start()

    def start(self):
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)

    def ask(self, path, run):
        """The worker's report on `path` (called if `run`); or a string saying
        what happened if it took over TIMEOUT or died (the worker is then
        replaced)."""
        self.proc.stdin.write(f"{path}\t{int(run)}\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], TIMEOUT)
        line = self.proc.stdout.readline() if ready else ""
        if line:
            return json.loads(line)
        self.proc.kill()
        code = self.proc.wait()
        self.start()
        return f"the worker died (exit code {code})" if ready else \
            f"loading or calling took over {TIMEOUT} s (a hang)"

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


# --- The comparison -------------------------------------------------------------

def main(load_files, corpus, calls):
    paths = sorted(str(p) for p in pathlib.Path(corpus).iterdir() if p.is_file())
    cpp = cpp_verdicts(load_files, paths)
    problems = collections.Counter()
    examples = {}

    def problem(key, path):
        problems[key] += 1
        examples.setdefault(key, path)

    if not calls:
        # The reader without the compiled part: the source tree's package.
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
    import torchcap  # with --call, the package under test, from PYTHONPATH
    import torchcap._load
    worker = Worker() if calls else None
    counts = collections.Counter()
    for path in paths:
        if calls:
            report = worker.ask(path, cpp[path][0] in ("OK", "RUNERR"))
            if isinstance(report, str):
                problem(report, path)
                continue
        else:
            try:
                torchcap._load.load_in_python(path, verify_checksums=False)
                report = {"python": ["OK", ""]}
            except torchcap.FormatError as e:
                report = {"python": ["ERR", str(e)]}
            except Exception as e:  # noqa: BLE001 -- any other exception is the finding
                report = {"python": ["RAISED", f"{type(e).__name__}: {str(e)[:200]}"]}
        want, want_message = cpp[path]
        strip = len(path) + 2
        if want == "FINDING":
            problem(f"C++: {want_message[:200]}", path)
            continue
        want = "ERR" if want == "ERR" else "OK"

        verdict, message = report["python"]
        if verdict == "RAISED":
            problem(f"the Python reader raised {message}", path)
        else:
            expected = any(p in message for p in PYTHON_ONLY) or (
                verdict == "OK" and CPP_ONLY.search(want_message)) or (
                verdict == "ERR" and STRICTER_IN_PYTHON.search(message))
            if verdict != want and not expected:
                problem(f"C++ {want} {want_message[strip:][:120]!r} / Python reader {verdict} "
                        f"{message[strip:][:120]!r}", path)
        if not calls:
            continue
        verdict, message = report["compiled"]
        counts[f"torchcap.load {verdict}"] += 1
        if verdict == "RAISED":
            problem(f"torchcap.load raised {message}", path)
        elif verdict != want and verdict == "ERR" and STRICTER_IN_PYTHON.search(message):
            counts["refused only in Python (its meta kernels)"] += 1
        elif verdict != want:
            problem(f"C++ {want} {want_message[strip:][:120]!r} / torchcap.load {verdict} "
                    f"{message[strip:][:120]!r}", path)
        outcome = report.get("compiled_call")
        if outcome:
            counts[f"call {outcome[0]}"] += 1
            if outcome[0] == "bare":
                problem(f"calling what torchcap.load loaded raised {outcome[1][:160]}", path)
        reader = report.get("python_call")
        if reader and outcome and reader[0] not in ("ok", "known") and outcome[0] == "ok":
            problem(f"the Python reader's module failed where the compiled one ran: "
                    f"{reader[1][:160]}", path)
    if worker:
        worker.close()
    loaded = sum(1 for v, _ in cpp.values() if v != "ERR")
    print(f"compare_loaders: {len(paths)} files, {loaded} load in C++"
          + "".join(f", {n} {k}" for k, n in sorted(counts.items()))
          + f"; {sum(problems.values())} problems")
    for key, n in problems.most_common():
        print(f"  {n} x {key}\n      e.g. {examples[key]}")
    return 1 if problems else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        worker()
        sys.exit(0)
    args = sys.argv[1:]
    calls = "--call" in args
    args = [a for a in args if a != "--call"]
    if len(args) != 2:
        sys.exit(__doc__)
    sys.exit(main(args[0], args[1], calls))
