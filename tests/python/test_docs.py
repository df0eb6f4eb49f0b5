"""The documentation is executed: every command shown with a `$ ` prompt in a
fenced code block of README.md and docs/*.md runs, and every ```python block,
and what each prints is compared with what the document quotes under it.
docs/testing.md ("The documentation is executed") states the conventions;
in short:

- The blocks of one document run in order, in one temporary directory, so a
  document may use the files it made earlier. `torchcap` is the command this
  build made (TORCHCAP_CLI, through PATH); a command runs under bash, with
  stderr and stdout together, and must fail exactly when the output quoted
  under it has a `torchcap: error:` line. The files the documents use
  without making them (FIXTURES) are made when a command first names them.
- A ```python block runs as a program of its own (this interpreter, the
  build's package on PYTHONPATH). What it prints is compared with the next
  fenced block when only prose separates the two and that block is plain
  (no language, no prompt), or is marked `<!-- output of: STATEMENT -->`, in
  which case STATEMENT runs after the program (`print(gm.code)`). Otherwise
  it must print nothing.
- Lines are compared exactly, but for trailing spaces, blank lines before and
  after the output, and what varies from run to run or machine to machine:
  a duration (a number and `ms`, `us` or `s`, such as `13.5 ms` or `0.1 s`)
  and the value of a JSON key ending in `_ms`; numbers with 7 or more decimals (JSON's full doubles, which
  depend on the BLAS kernels of the CPU) are compared to 6 significant
  digits, as the text output prints them. In a quoted line `...` stands for
  any text; a quoted line that is only `...` for any number of lines.
- `<!-- not run: REASON -->` on the line before a fence leaves that block
  out; each such block is reported as a skipped test with its reason.
"""

import dataclasses
import difflib
import os
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TORCHCAP = os.environ.get("TORCHCAP_CLI")

# Files the documents use without making them: name -> the Python that makes it
# (in the directory it is run in). Random weights, fixed seeds.
FIXTURES = {
    "resnet18.pt": "import torch, torchvision\n"
                   "torch.manual_seed(0)\n"
                   "torch.jit.script(torchvision.models.resnet18(weights=None).eval()).save('resnet18.pt')\n",
    "vit_b_32.pt": "import torch, torchvision\n"
                   "torch.manual_seed(0)\n"
                   "torch.jit.script(torchvision.models.vit_b_32(weights=None).eval()).save('vit_b_32.pt')\n",
}

COMMAND_TIMEOUT_S = 300
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^`\s]*)")
MARKER = re.compile(r"^\s*<!--\s*(not run|output of)\s*:\s*(.*?)\s*-->\s*$")
MARKER_LIKE = re.compile(r"^\s*<!--\s*(not run|output of)\b")
HEADING = re.compile(r"^#{1,6}\s")


@dataclasses.dataclass
class Block:
    path: pathlib.Path
    line: int                  # the opening fence's line, from 1
    language: str              # the fence's info string: "python", "cpp", "" ...
    lines: list                # the content, the fence's indentation removed
    marker: tuple = None       # ("not run", REASON) or ("output of", STATEMENT)
    prose_since_previous: list = dataclasses.field(default_factory=list)

    @property
    def where(self):
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def is_transcript(self):
        first = next((l for l in self.lines if l.strip()), "")
        return self.language not in ("python", "py") and first.startswith("$ ")

    @property
    def is_python(self):
        return self.language in ("python", "py")


@dataclasses.dataclass
class Command:
    line: int                  # line in the document of its `$ `
    text: str                  # what runs, continuation lines included
    expected: list             # the lines quoted under it


def parse_blocks(path):
    """The fenced blocks of a Markdown file, with the marker before each and
    the lines of prose between it and the block before it."""
    blocks, prose = [], []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m and m.group(2)[0] == "`" and "`" in lines[i][m.end(2):]:
            m = None  # inline code at the start of a line: an info string has no backtick
        if not m:
            prose.append(lines[i])
            i += 1
            continue
        indent, fence, language = m.groups()
        start, body = i, []
        i += 1
        while i < len(lines) and not (lines[i].strip().startswith(fence[0] * len(fence))
                                      and not lines[i].strip().strip(fence[0])):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        i += 1  # the closing fence
        before = [l for l in prose if l.strip()]
        marker = MARKER.match(before[-1]) if before else None
        blocks.append(Block(path, start + 1, language, body,
                            marker.groups() if marker else None, prose))
        prose = []
    return blocks


def parse_commands(block):
    """The `$ ` commands of a transcript, each with the output quoted under it.
    A command continues on the next line after a trailing backslash or while
    a quote is open (`python3 -c '...'` over several lines)."""
    commands, i, lines = [], 0, block.lines
    while i < len(lines) and not lines[i].strip():
        i += 1
    while i < len(lines):
        assert lines[i].startswith("$ "), f"{block.where}: text before the first `$ `: {lines[i]!r}"
        line, text = block.line + 1 + i, lines[i][2:]
        i += 1
        while _incomplete(text) and i < len(lines):
            text += "\n" + lines[i]
            i += 1
        expected = []
        while i < len(lines) and not lines[i].startswith("$ "):
            expected.append(lines[i])
            i += 1
        commands.append(Command(line, text, expected))
    return commands


def _incomplete(text):
    try:
        shlex.split(text)
    except ValueError:  # an open quote, or a trailing backslash
        return True
    return False


def document_steps(path):
    """What a document runs, in order: ("shell", block) and ("python", block,
    output block or None), and the blocks it does not run, with why."""
    steps, not_run = [], []
    blocks = parse_blocks(path)
    for k, block in enumerate(blocks):
        if not (block.is_transcript or block.is_python):
            continue
        if block.marker and block.marker[0] == "output of":
            continue  # what the block before it prints, not a program
        if block.marker and block.marker[0] == "not run":
            not_run.append((block, block.marker[1]))
            continue
        if block.is_transcript:
            steps.append(("shell", block))
            continue
        after = blocks[k + 1] if k + 1 < len(blocks) else None
        output = None
        if after is not None and not any(HEADING.match(l) for l in after.prose_since_previous):
            if after.marker and after.marker[0] == "output of":
                output = after
            elif after.marker is None and after.language == "" and not after.is_transcript:
                output = after
        steps.append(("python", block, output))
    return steps, not_run


# --- comparing -------------------------------------------------------------

_JSON_MS = re.compile(r'("\w*_ms"\s*:\s*)-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?')
_TIME = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)? ?(?:ms|us|s)\b")
_LONG_FLOAT = re.compile(r"-?\d+\.\d{7,}(?:[eE][-+]?\d+)?")


def mask(line):
    line = _JSON_MS.sub(r"\1<ms>", line)
    line = _TIME.sub("<time>", line)
    return _LONG_FLOAT.sub(lambda m: f"{float(m.group()):.6g}", line)


def trim(lines):
    lines = [l.rstrip() for l in lines]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return lines


def line_matches(expected, actual):
    pieces = [re.escape(p) for p in mask(expected).split("...")]
    return re.fullmatch(".*".join(pieces), mask(actual), re.S) is not None


def output_matches(expected, actual):
    """Whether the quoted lines describe the printed ones: a quoted line that
    is only `...` stands for any number of lines."""
    expected, actual = trim(expected), trim(actual)
    # can[i][j]: expected[i:] matches actual[j:]
    can = [[False] * (len(actual) + 1) for _ in range(len(expected) + 1)]
    can[len(expected)][len(actual)] = True
    for i in range(len(expected) - 1, -1, -1):
        for j in range(len(actual), -1, -1):
            if expected[i].strip() == "...":
                can[i][j] = can[i + 1][j] or (j < len(actual) and can[i][j + 1])
            else:
                can[i][j] = j < len(actual) and line_matches(expected[i], actual[j]) and can[i + 1][j + 1]
    return can[0][0]


def mismatch(where, what, expected, actual, note=""):
    diff = "\n".join(difflib.unified_diff(trim(expected), trim(actual), "quoted", "printed", lineterm=""))
    return f"{where}: {what}{note}\n{diff or '(the lines differ only by ... or masked numbers)'}\n" \
           f"--- printed, in full:\n" + "\n".join(trim(actual))


# --- running ----------------------------------------------------------------

@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory):
    """A directory for PATH where `torchcap` is the command of this build."""
    if not TORCHCAP:
        pytest.skip("TORCHCAP_CLI names no torchcap command (ctest sets it)")
    directory = tmp_path_factory.mktemp("bin")
    (directory / "torchcap").symlink_to(TORCHCAP)
    return directory


@pytest.fixture(scope="module")
def fixtures_dir():
    # Removed afterwards, as each document's directory is: ViT-B/32 alone is
    # 350 MB, and pytest keeps the temporary directories of recent runs.
    with tempfile.TemporaryDirectory(prefix="torchcap_docs_fixtures_") as directory:
        yield pathlib.Path(directory)


def provide_fixtures(command, directory, fixtures_dir):
    for name, source in FIXTURES.items():
        if re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w.-])", command) and not (directory / name).exists():
            made = fixtures_dir / name
            if not made.exists():
                subprocess.run([sys.executable, "-c", source], cwd=fixtures_dir, check=True)
            (directory / name).symlink_to(made)


def run_transcript(block, directory, env, fixtures_dir):
    failures = []
    for command in parse_commands(block):
        where = f"{block.path.relative_to(ROOT)}:{command.line}"
        provide_fixtures(command.text, directory, fixtures_dir)
        result = subprocess.run(["bash", "-c", command.text], cwd=directory, env=env, text=True,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                timeout=COMMAND_TIMEOUT_S)
        printed = result.stdout.splitlines()
        should_fail = any(l.startswith("torchcap: error:") for l in command.expected)
        if (result.returncode != 0) != should_fail:
            failures.append(mismatch(where, f"`$ {command.text}` exited with {result.returncode}",
                                     command.expected, printed,
                                     " (the docs quote an error)" if should_fail else ""))
        elif not output_matches(command.expected, printed):
            failures.append(mismatch(where, f"`$ {command.text}` printed other lines than quoted",
                                     command.expected, printed))
    return failures


def run_python(block, output, directory, env):
    source = "\n".join(block.lines) + "\n"
    if output is not None and output.marker:
        source += output.marker[1] + "\n"
    program = directory / f"block_{block.path.stem}_{block.line}.py"
    program.write_text(source)
    result = subprocess.run([sys.executable, program.name], cwd=directory, env=env, text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            timeout=COMMAND_TIMEOUT_S)
    printed = result.stdout.splitlines()
    expected = output.lines if output is not None else []
    if result.returncode != 0:
        return [mismatch(block.where, f"the python block exited with {result.returncode}", expected, printed)]
    if not output_matches(expected, printed):
        what = (f"the python block printed other lines than {output.where} quotes" if output is not None
                else "the python block printed lines, and no block after it quotes them")
        return [mismatch(block.where, what, expected, printed)]
    return []


STEPS = {path: document_steps(path) for path in DOCUMENTS}
RUN = [path for path in DOCUMENTS if STEPS[path][0]]
NOT_RUN = [(block, reason) for path in DOCUMENTS for block, reason in STEPS[path][1]]


@pytest.mark.parametrize("path", RUN, ids=[str(p.relative_to(ROOT)) for p in RUN])
def test_document(path, bin_dir, fixtures_dir):
    """Runs the document's blocks in order in one directory; reports every
    block whose output differs from the quoted one, not only the first."""
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    failures = []
    with tempfile.TemporaryDirectory(prefix="torchcap_docs_") as directory:
        for step in STEPS[path][0]:
            if step[0] == "shell":
                failures += run_transcript(step[1], pathlib.Path(directory), env, fixtures_dir)
            else:
                failures += run_python(step[1], step[2], pathlib.Path(directory), env)
    if failures:
        pytest.fail(f"{len(failures)} of the quoted outputs of {path.relative_to(ROOT)} differ from what "
                    f"runs print now:\n\n" + "\n\n".join(failures), pytrace=False)


@pytest.mark.parametrize("block,reason", NOT_RUN, ids=[b.where for b, _ in NOT_RUN])
def test_not_run(block, reason):
    """One skipped test per block marked `<!-- not run: REASON -->`, so that
    pytest -rs lists them with their reasons."""
    pytest.skip(f"{block.where}: {reason}")


def test_markers():
    """Markers sit on the line before a fence and say why; `output of`
    follows a python block that runs; commands name the interpreter that has
    torch."""
    problems = []
    for path in DOCUMENTS:
        lines = path.read_text().splitlines()
        for k, line in enumerate(lines):
            if MARKER_LIKE.search(line):
                where = f"{path.relative_to(ROOT)}:{k + 1}"
                m = MARKER.match(line)
                if not m or not m.group(2):
                    problems.append(f"{where}: write `<!-- not run: REASON -->` or `<!-- output of: STATEMENT -->`")
                nxt = next((l for l in lines[k + 1:] if l.strip()), "")
                if not FENCE.match(nxt):
                    problems.append(f"{where}: a marker belongs on the line before a fence")
        steps, _ = STEPS[path]
        outputs = {step[2].line for step in steps if step[0] == "python" and step[2] is not None}
        for block in parse_blocks(path):
            if block.marker and block.marker[0] == "output of" and block.line not in outputs:
                problems.append(f"{block.where}: `output of` follows no python block that runs")
            if block.is_transcript:
                for command in parse_commands(block):
                    if re.match(r"(\S+=\S+\s+)*python3?\b", command.text):
                        problems.append(f"{path.relative_to(ROOT)}:{command.line}: say /usr/bin/python3, "
                                        "the interpreter that has torch (python3-torch)")
    assert not problems, "\n".join(problems)
