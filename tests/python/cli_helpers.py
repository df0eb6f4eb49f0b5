"""What the command-line tests share: running `torchcap` (the executable ctest
names in TORCHCAP_CLI) and reading its one-line errors, and writing small
TorchScript models from source."""

import os
import subprocess
import sys

TORCHCAP = os.environ["TORCHCAP_CLI"]


def run(*args, check=True, env=None):
    result = subprocess.run([TORCHCAP, *map(str, args)], capture_output=True, text=True, env=env)
    if check and result.returncode != 0:
        raise AssertionError(f"torchcap {' '.join(map(str, args))} failed:\n{result.stderr}")
    return result


def error_of(*args, code=1, env=None):
    """Runs a failing command; returns its single stderr line."""
    result = run(*args, check=False, env=env)
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{result.stderr}"
    assert lines[0].startswith("torchcap: error: "), lines[0]
    assert "Exception raised from" not in result.stderr and "frame #" not in result.stderr
    assert "report a bug" not in result.stderr.lower()
    return lines[0][len("torchcap: error: "):]


def script_model(directory, source_lines, saved_as):
    """Scripts and saves `M()` defined by `source_lines` as directory/saved_as.

    The source goes into directory/make_model.py first: TorchScript needs it in a
    file, and the model's frames then name that file. Returns (model, source)."""
    model = directory / saved_as
    source = directory / "make_model.py"
    source.write_text("\n".join([*source_lines, f"torch.jit.script(M()).save({str(model)!r})"]))
    subprocess.run([sys.executable, str(source)], check=True)
    return model, source
