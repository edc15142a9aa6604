"""Property-based: whatever a user, a site profile or a job folder throws at the CLI, it keeps its contract.

  - exit status 0 or 2 (1 only where a scheduler command ran and failed);
  - on exit 2 exactly one stderr line, never a traceback (an exception escaping main() fails the test);
  - nothing written outside the example's own folder (and no job folder for dry-runs and renders);
  - no process killed: a canary `sleep` that hostile job folders name survives every example;
  - bounded time.

hpcvod.cli.main runs in this process (a subprocess per example would cost seconds). Examples are derandomized
and few, so the file runs the same everywhere in well under a minute; the fake scheduler tools on PATH record
every argv they get, so no hostile word reaches them as an option.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from hpcvod.cli import main
from hpcvod.jobs.render import environment
from hpcvod.schedulers import available_schedulers, scheduler_class
from hpcvod.sites import shipped_dir

SETTINGS = dict(deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
SLOW_LIMIT = 15.0  # seconds one example may take (a refused cancel is instant; the local grace time is 5 s)
TRAIN = "print('train')\n"
# hpcvod's own words in scheduler command lines; everything else a fake tool sees must be a job id
FIXED_WORDS = {"--", "--json", "--jobs", "--noheader", "--format", "%i|%T|%r|%S", "show", "job", "--oneliner",
               "--allocations", "--parsable2", "JobID,State,ExitCode,Start,End", "-f", "-x", "-u", "*", "-j",
               "-terse",
               # kubectl's (hpcvod/schedulers/kubernetes.py); its launcher Job is named job/ID-launcher
               "get", "mpijob", "--namespace", "default", "--output", "json", "logs", "delete", "--wait=false"}
CANARY: dict[str, int] = {}  # the canary's pid, for the job-folder strategies (drawn once the fixture has run)
SCHEDULER_TOOLS = ("scancel", "squeue", "scontrol", "sacct", "sbatch", "qdel", "qstat", "qacct", "qsub", "kubectl")


# ---- the harness ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def arena():
    """One folder for the whole module: fake scheduler tools, caches and configs, a canary process."""
    root = Path(tempfile.mkdtemp(prefix="hpcvod-hostile-"))
    bin_dir = root / "bin"
    bin_dir.mkdir()
    calls = root / "calls.log"
    for tool in SCHEDULER_TOOLS:
        path = bin_dir / tool
        path.write_text(f'#!/bin/sh\n{{ printf "%s\\0" "{tool}" "$@"; printf "\\n"; }} >> "{calls}"\n'
                        'echo "fake scheduler: no" >&2\nexit 1\n')
        path.chmod(0o755)
    canary = subprocess.Popen(["sleep", "3600"], start_new_session=True)
    CANARY["pid"] = canary.pid
    with pytest.MonkeyPatch.context() as mp:
        for key in [k for k in os.environ if k.startswith("HPCVOD_")]:
            mp.delenv(key)
        mp.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        mp.setenv("XDG_CONFIG_HOME", str(root / "config"))
        mp.setenv("XDG_CACHE_HOME", str(root / "cache"))  # jinja's compiled templates: inside the arena too
        mp.setenv("HOME", str(root / "home"))
        environment.cache_clear()  # the template environment keeps the cache folder it found first
        try:
            yield {"root": root, "calls": calls, "canary": canary}
        finally:
            environment.cache_clear()  # the arena's cache folder goes away below
    canary.kill()
    canary.wait()
    shutil.rmtree(root, ignore_errors=True)


def _start_time(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def _unused_pid() -> int:
    pid = int(Path("/proc/sys/kernel/pid_max").read_text()) - 1
    while Path(f"/proc/{pid}").exists():
        pid -= 1
    return pid


def _tree(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


@contextlib.contextmanager
def _example(arena):
    """A fresh working folder with train.py; afterwards: nothing new outside it, the canary alive."""
    root = arena["root"]
    work = Path(tempfile.mkdtemp(dir=root, prefix="work-"))
    (work / "train.py").write_text(TRAIN)
    arena["calls"].unlink(missing_ok=True)
    outside = _tree(root) - {p for p in _tree(root) if p.startswith(work.name)}
    cwd = os.getcwd()
    os.chdir(work)
    try:
        yield work
    finally:
        os.chdir(cwd)
    after = {p for p in _tree(root) if not p.startswith(work.name)}
    new = {p for p in after - outside if not p.startswith(("cache", "calls.log", "home"))}
    assert not new, f"written outside the example's folder: {sorted(new)}"
    assert arena["canary"].poll() is None, "the canary process was killed"
    shutil.rmtree(work, ignore_errors=True)


def run_cli(argv: list[str]) -> tuple[int, str, str, float]:
    out, err = io.StringIO(), io.StringIO()
    start = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as done:  # argparse's --help/--version, as the real command would exit
            code = done.code if isinstance(done.code, int) else 0
    return code, out.getvalue(), err.getvalue(), time.monotonic() - start


def assert_contract(argv: list[str], code: int, err: str, elapsed: float, allowed=(0, 2)) -> None:
    event(f"exit {code}")  # shown by --hypothesis-show-statistics: the examples reach more than one outcome
    assert code in allowed, (argv, code, err)
    assert "Traceback" not in err, (argv, err)
    if code == 2:
        lines = err.splitlines()
        if argv[:2] == ["sites", "validate"]:  # every problem of the file, one line each
            assert lines and all(re.match(r"\S+: ", line) for line in lines), (argv, err)  # where: what
        else:
            assert len(lines) == 1, (argv, err)
    assert elapsed < SLOW_LIMIT, (argv, elapsed)


# ---- strategies ----------------------------------------------------------------------------------------

# Text a shell, a terminal or a template could trip on; no NUL: a real argv cannot hold one.
NASTY = st.sampled_from(["", " ", "-", "--", "-5", "--user=root", "--help", "$(touch PWNED)", "`id`", "a;b", "a\nb",
                         "\r", "\t", "'", '"', "\\", "*", "?", "[", "{", "}", "~", "../../etc/passwd", "/dev/zero",
                         "\x1b[31m", "\u2028", "\u0661\u0662", "é", "💥", "%s%n", "a" * 300, "0", "00", "1e9",
                         "99999999999999999999", "-1", "nan", "1:2", "10:75:00", "3-00:00:00", "KEY=VALUE",
                         "HPCVOD_WORLD_SIZE=1", "1X=2", "A=\n"])
TEXT = st.one_of(NASTY, st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=30))
NUMBER = st.one_of(st.integers(1, 4).map(str), st.integers(-10**30, 10**30).map(str), NASTY)
SITES = st.one_of(st.sampled_from(sorted(p.stem for p in shipped_dir().glob("*.yaml"))), TEXT)

JOB_OPTIONS = {
    "--site": SITES, "--nodes": NUMBER, "--gpus-per-node": NUMBER, "--tasks-per-node": NUMBER,
    "--cpus-per-task": NUMBER, "--time": st.one_of(st.sampled_from(["00:10:00", "30", "1-00:00:00"]), NUMBER, TEXT),
    "--partition": st.one_of(st.sampled_from(["gpu", "cpu", "local"]), TEXT), "--queue": TEXT,
    "--account": st.one_of(st.just("proj1"), TEXT), "--job-name": TEXT, "--env": st.one_of(TEXT, st.tuples(TEXT, TEXT).map("=".join)),
    "--container": TEXT,
    # the per-job scheduler options (hpcvod/sites/joboptions.py): refused in one line, never a broken script
    "--mem": st.one_of(st.sampled_from(["64G", "512", "1T"]), NUMBER, TEXT), "--mem-per-gpu": NUMBER,
    "--constraint": st.one_of(st.just("a100&ib"), TEXT), "--qos": TEXT, "--reservation": TEXT, "--nodelist": TEXT,
    "--exclude": TEXT, "--begin": st.one_of(st.sampled_from(["2030-01-01T10:00", "now+60", "2026-02-30"]), TEXT),
    "--mail-type": st.one_of(st.just("BEGIN,END"), TEXT), "--mail-user": TEXT,
    "--dependency": st.one_of(st.sampled_from(["afterok:12:13", "singleton", "afterany:train-x"]), TEXT),
    "--array": st.one_of(st.sampled_from(["0-9", "1,3,5", "0-15%4", "9-1"]), NUMBER, TEXT),
    "--sched-opt": st.one_of(st.sampled_from(["comment=\"a b\"", "gres-flags=enforce-binding", "x=$(id)"]), TEXT),
}


@st.composite
def job_arguments(draw) -> list[str]:
    argv: list[str] = []
    for flag in draw(st.lists(st.sampled_from(sorted(JOB_OPTIONS)), max_size=4)):
        value = draw(JOB_OPTIONS[flag])
        argv += [f"{flag}={value}"] if draw(st.booleans()) else [flag, value]
    if draw(st.booleans()):
        argv.append("--json")
    program = draw(st.one_of(st.just("train.py"), st.just("./train.py"), TEXT))
    return argv + ["--", program, *draw(st.lists(TEXT, max_size=3))]


@settings(max_examples=100, **SETTINGS)
@given(args=job_arguments())
@example(args=["--account=--", "--", "train.py"])  # argparse handed the option [] (found by this test)
@example(args=["--site", "a" * 300, "--", "b" * 300])  # pathlib's is_file lets ENAMETOOLONG through (found so)
def test_submit_dry_run_with_hostile_arguments(arena, args):
    with _example(arena) as work:
        argv = ["submit", "--dry-run", "--output-dir", "jobs", *args]
        code, out, err, elapsed = run_cli(argv)
        assert_contract(argv, code, err, elapsed)
        if code == 0 and "--help" not in args:
            assert out.startswith("#!/bin/bash\n") or out.startswith("{"), (argv, out[:200])
        assert not (work / "jobs").exists(), "a dry-run created a job folder"
        assert (work / "train.py").read_text() == TRAIN
        assert not arena["calls"].exists(), "a dry-run ran a scheduler command"


@settings(max_examples=100, **SETTINGS)
@given(args=job_arguments(), target=st.one_of(st.just("out.sh"), st.sampled_from(["train.py", "mine.txt", "sub/x.sh", "."]),
                                              TEXT.filter(lambda t: "/" not in t)),
       force=st.booleans())
def test_render_with_hostile_arguments(arena, args, target, force):
    with _example(arena) as work:
        (work / "mine.txt").write_text("mine")
        argv = ["render", "-o", target, *(["--force"] if force else []), *args]
        code, out, err, elapsed = run_cli(argv)
        assert_contract(argv, code, err, elapsed)
        assert (work / "train.py").read_text() == TRAIN, "render wrote over the training script"
        if not force:
            assert (work / "mine.txt").read_text() == "mine", "render overwrote a file it did not render"
        assert not [p for p in work.iterdir() if p.name.endswith(".tmp")], "a temporary file was left behind"


# ---- site profiles -------------------------------------------------------------------------------------

MINIMAL = {"scheduler": "slurm", "launcher": {"kind": "srun", "mpi_plugin": "pmix"}, "mpi": {"flavour": "openmpi"},
           "partitions": {"gpu": {"cpus_per_node": 8, "gpus_per_node": 2}}}
# where a hostile value goes; launcher.executable and the like are left out: they name programs hpcvod runs
KEY_PATHS = [("scheduler",), ("partitions",), ("partitions", "gpu"), ("partitions", "gpu", "cpus_per_node"),
             ("partitions", "gpu", "gpus_per_node"), ("partitions", "gpu", "max_time"),
             ("partitions", "gpu", "default_time"), ("partitions", "gpu", "max_nodes"), ("partitions", "gpu", "env"),
             ("launcher",), ("launcher", "kind"), ("launcher", "mpi_plugin"), ("launcher", "args"), ("mpi",),
             ("mpi", "flavour"), ("mpi", "env"), ("mpi", "flavour_env"), ("extends",), ("hostnames",),
             ("default_partition",), ("account",), ("interconnect",), ("interconnect", "gid_index"),
             ("modules",), ("module_purge",), ("setup",), ("container",), ("container", "runtime"),
             ("directives",), ("directives", "extra"), ("env",), ("scheduler_options",),
             ("scheduler_options", "gpu_request"), ("description",), ("bogus_key",)]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(allow_nan=True), TEXT,
                    st.sampled_from(["auto", "slurm", "local", "pbs", "srun", "mpiexec", "01:00:00", "gpu"]))
YAML_DATA = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                          st.dictionaries(TEXT, inner, max_size=4)), max_leaves=12)
RAW_YAML = st.sampled_from(["[" * 2000, "{a: " * 5000, "- " * 3000 + "x", "a: &a [*a]", "a: !!python/object:os.system x",
                            "%YAML 9.9\n---\na: 1", "a: 1\n---\nb: 2", "\ufeffscheduler: slurm", "a: 2024-13-45",
                            "extends: /dev/zero", "extends: ../../../etc/passwd", "extends: .", "? [a]\n: b",
                            "a: !!binary ###", "a: " + "9" * 5000, "\t- x", "a:\n  - b\n c: d"])


# values of the right shape for many keys, so that some mutated profiles pass validation and reach the plan
PLAUSIBLE = st.one_of(st.integers(0, 100), st.sampled_from(["auto", "gpu", "01:00:00", "2-00:00:00", "pmix", "none",
                                                            "mpirun", "openmpi", "mpich", "roce", "apptainer"]),
                      st.lists(st.sampled_from(["gcc/12", "echo hi", "--exclusive", "login*", "$(id)"]), max_size=3),
                      st.dictionaries(st.sampled_from(["FOO", "BAR_1", "gpu", "cpu"]),
                                      st.sampled_from(["1", "x y", "$HOME", "a\nb"]), max_size=2))


@st.composite
def profiles(draw) -> bytes:
    kind = draw(st.sampled_from(["mutated", "mutated", "data", "raw", "bytes"]))
    if kind == "raw":
        return draw(RAW_YAML).encode()
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "data":
        return yaml.safe_dump(draw(YAML_DATA), allow_unicode=True).encode()
    data = json.loads(json.dumps(MINIMAL))
    for path in draw(st.lists(st.sampled_from(KEY_PATHS), min_size=1, max_size=3)):
        node = data
        for key in path[:-1]:
            node = node.setdefault(key, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node[path[-1]] = draw(st.one_of(PLAUSIBLE, YAML_DATA))
    return yaml.safe_dump(data, allow_unicode=True).encode()


@settings(max_examples=150, **SETTINGS)
@given(profile=profiles(), command=st.sampled_from(["validate", "show", "submit", "render"]))
def test_hostile_site_profiles(arena, profile, command):
    with _example(arena) as work:
        (work / "site.yaml").write_bytes(profile)
        argv = {"validate": ["sites", "validate", "site.yaml"], "show": ["sites", "show", "./site.yaml"],
                "submit": ["submit", "--dry-run", "--site", "./site.yaml", "train.py"],
                "render": ["render", "--site", "./site.yaml", "train.py"]}[command]
        code, _, err, elapsed = run_cli(argv)
        assert_contract(argv, code, err, elapsed)
        assert not arena["calls"].exists()


# ---- job folders ---------------------------------------------------------------------------------------


@st.composite
def pids(draw) -> object:
    """Pids a hostile job.json may name: the canary, none that runs, or no pid at all. Never a random live
    process: this may run as root, and a broken cancel must only ever be able to hit the canary."""
    canary = CANARY["pid"]
    return draw(st.one_of(st.just(canary), st.just(_unused_pid()), st.sampled_from([0, 1, -1, 2**31, 2**64, True]),
                          st.integers(10**7, 10**12), TEXT, st.none(), st.floats()))


@st.composite
def job_folders(draw) -> dict:
    """A job folder as submit writes it (often a local job naming the canary, with its true start time), then
    up to three fields of job.json changed or dropped, and each file now and then replaced by garbage."""
    canary = CANARY["pid"]
    scheduler = draw(st.sampled_from(available_schedulers()))
    if scheduler == "local":
        pid = draw(st.sampled_from([canary, canary, _unused_pid()]))
        record = {"job_id": f"local-{pid}", "scheduler": "local", "pid": pid, "pgid": pid,
                  "start_time": _start_time(canary) if pid == canary else 1}
    else:
        record = {"job_id": draw(st.sampled_from(["123", "123_4", "1.server", "77"])), "scheduler": scheduler}
    changes = {"job_id": st.one_of(st.just(f"local-{canary}"), st.sampled_from(["--user=root", "-5", "local-0",
                                                                                "123\n--me", "1[].s"]), TEXT),
               "scheduler": st.one_of(st.sampled_from(available_schedulers()), TEXT), "pid": pids(), "pgid": pids(),
               "start_time": st.one_of(st.integers(-5, 10**12), st.none(), TEXT)}
    for key in draw(st.lists(st.sampled_from(sorted(changes)), max_size=3, unique=True)):
        if draw(st.booleans()):
            record.pop(key, None)
        else:
            record[key] = draw(changes[key])
    plan = {"site": "x", "scheduler": scheduler,
            "site_source": draw(st.sampled_from([str(shipped_dir() / f"{scheduler}.yaml"), "/dev/zero", "", "x"]))}
    kind = draw(st.sampled_from(["record"] * 4 + ["bytes", "json"]))
    job_json = {"record": json.dumps(record).encode(), "bytes": draw(st.binary(max_size=80)),
                "json": draw(YAML_DATA.map(lambda d: json.dumps(d).encode()))}[kind]
    request = draw(st.sampled_from(["plan"] * 4 + ["bytes", "none"]))
    request_json = {"plan": json.dumps({"plan": plan}).encode(), "bytes": draw(st.binary(max_size=40)),
                    "none": None}[request]
    exitcode = draw(st.one_of(st.none(), st.none(), st.sampled_from([b"0\n", b"143\n", b""]), st.binary(max_size=8)))
    output = draw(st.one_of(st.just(b"log\n"), st.just(b"log\n"), st.none(), st.binary(max_size=100),
                            st.sampled_from(["folder", "fifo"])))
    return {"job.json": job_json, "request.json": request_json, "exitcode": exitcode, "output.log": output}


def _audit_scheduler_calls(calls: Path) -> None:
    """Every word a fake scheduler tool got is one of hpcvod's own or a job id of some scheduler's form."""
    if not calls.exists():
        return
    patterns = [scheduler_class(name).job_id_pattern for name in available_schedulers()]
    for line in calls.read_bytes().split(b"\n"):
        words = [w.decode() for w in line.split(b"\0") if w]
        for word in words[1:]:
            job_id = word.removeprefix("job/").removesuffix("-launcher") if words[0] == "kubectl" else word
            assert word in FIXED_WORDS or any(p.fullmatch(job_id) for p in patterns), (words, word)


@settings(max_examples=250, **SETTINGS)
@given(folder=job_folders(), command=st.sampled_from(["status", "logs", "cancel"]), by_id=st.booleans())
def test_hostile_job_folders(arena, folder, command, by_id):
    with _example(arena) as work:
        job_dir = work / "hpcvod-jobs" / "job"
        job_dir.mkdir(parents=True)
        for name, content in folder.items():
            if content == "folder":
                (job_dir / name).mkdir()
            elif content == "fifo":
                os.mkfifo(job_dir / name)
            elif content is not None:
                (job_dir / name).write_bytes(content)
        job = str(job_dir)
        if by_id:  # by the id job.json records, looked up under ./hpcvod-jobs
            with contextlib.suppress(ValueError, LookupError, TypeError):
                job = str(json.loads(folder["job.json"])["job_id"]) or job
        argv = [command, job]
        before = {p for p in _tree(work) if not p.startswith("hpcvod-jobs")}
        code, _, err, elapsed = run_cli(argv)
        assert_contract(argv, code, err, elapsed, allowed=(0, 1, 2))
        if code == 1:  # only a scheduler command that ran and failed may give 1
            assert arena["calls"].exists() and err.startswith("hpcvod: "), (argv, err)
        _audit_scheduler_calls(arena["calls"])
        assert {p for p in _tree(work) if not p.startswith("hpcvod-jobs")} == before


@settings(max_examples=60, **SETTINGS)
@given(job=st.one_of(TEXT, st.sampled_from([f"local-{_unused_pid()}", "local-0", "local--1", "-5", "--user=root",
                                            "123", "123_4", "1[].s"])),
       command=st.sampled_from(["status", "cancel", "logs"]),
       site=st.sampled_from(["local", "slurm-ib-openmpi", "pbs-ib-openmpi", "sge-sandbox"]))
@example(job="a" * 300, command="status", site="local")  # ENAMETOOLONG from pathlib's is_dir (found by this test)
def test_hostile_job_ids(arena, job, command, site):
    with _example(arena):
        argv = [command, *(["--site", site] if command != "logs" else []), "--", job]
        code, _, err, elapsed = run_cli(argv)
        assert_contract(argv, code, err, elapsed, allowed=(0, 1, 2))
        if code == 1:
            assert arena["calls"].exists(), (argv, err)
        _audit_scheduler_calls(arena["calls"])
