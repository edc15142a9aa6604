"""Issue 23, the job-folder half: a jobs folder no other user can change (item 1), job files read never through a
link (item 3), what is printed from a job folder shown escaped (item 4), `logs --rank` linear on long lines
(item 12), an --output-dir that is no folder (item 13).

These run as root here: "another user" is a folder chowned to uid 65534 (nobody) or opened to others with chmod,
and, where the real attack is replayed, a second real user (test_privacy's `users`) running `mv` through runuser.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from hpcvod.jobs.jobdir import ensure_root, open_new_job_dir, ref_from_dir
from hpcvod.schedulers.jobfiles import write_job_file
from hpcvod.support.errors import UserError
from submission_helpers import one_error_line
from test_privacy import PEER, _as, users  # noqa: F401 - the fixture that makes a second real user

pytestmark = pytest.mark.timeout(300)

NOBODY = 65534
TRAIN = "print('trained', flush=True)\n"


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(TRAIN)
    return tmp_path


@pytest.fixture
def umask000():
    old = os.umask(0)  # the worst umask a user can have: what hpcvod creates must still be private
    yield
    os.umask(old)


def _submit(cli, *args: str) -> tuple[int, str, str]:
    """`hpcvod submit --wait` of train.py on the real local site (it runs, and has ended when this returns)."""
    return cli("submit", "--site", "local", "--wait", *args, "train.py")


# ---- item 1: job folders only where no other user can change them ---------------------------------------


def test_missing_parents_are_created_private_whatever_the_umask(cli, work, umask000):
    code, out, err = _submit(cli, "--output-dir", "proj/runs/jobs")
    assert code == 0, err
    for folder in (work / "proj", work / "proj" / "runs", work / "proj" / "runs" / "jobs"):
        assert _mode(folder) == 0o700, folder  # was 0777 with umask 000: anyone could swap `jobs`
    (job_dir,) = (work / "proj" / "runs" / "jobs").iterdir()
    assert _mode(job_dir) == 0o700
    assert "trained" in (job_dir / "output.log").read_text()


def _foreign_parent(work: Path) -> str:
    (work / "proj").mkdir()
    os.chown(work / "proj", NOBODY, -1)
    return "proj/jobs"


def _foreign_root(work: Path) -> str:
    (work / "proj").mkdir()
    (work / "proj" / "jobs").mkdir()
    os.chown(work / "proj" / "jobs", NOBODY, -1)  # someone else's folder put where ours was
    return "proj/jobs"


def _world_writable_parent(work: Path) -> str:
    (work / "proj").mkdir()
    (work / "proj").chmod(0o777)
    return "proj/runs/jobs"


def _group_writable_parent(work: Path) -> str:
    (work / "proj").mkdir()
    os.chown(work / "proj", -1, NOBODY)  # a group that is not the owner's own
    (work / "proj").chmod(0o775)
    return "proj/jobs"


def _world_writable_root(work: Path) -> str:
    (work / "jobs").mkdir()
    (work / "jobs").chmod(0o1777)  # sticky is fine above the jobs folder, not for the jobs folder itself
    return "jobs"


def _foreign_link(work: Path) -> str:
    (work / "mine").mkdir(mode=0o700)
    (work / "proj").mkdir()
    (work / "proj").chmod(0o1777)
    os.symlink(work / "mine", work / "proj" / "jobs")
    os.lchown(work / "proj" / "jobs", NOBODY, -1)  # a link another user left in a sticky folder
    return "proj/jobs/x"


def _foreign_parent_far_up(work: Path) -> str:
    (work / "a").mkdir()
    os.chown(work / "a", NOBODY, -1)
    (work / "a" / "b").mkdir()
    return str(work / "a" / "b" / "jobs")  # absolute: every folder from / is checked


UNTRUSTED = [
    ("parent owned by another user", _foreign_parent, "belongs to user nobody (uid 65534)"),
    ("jobs folder owned by another user", _foreign_root, "belongs to user nobody (uid 65534)"),
    ("parent writable by everyone", _world_writable_parent, "can be written by every user (mode 0777)"),
    ("parent writable by a group", _group_writable_parent, "can be written by group"),
    ("sticky jobs folder", _world_writable_root, "can be written by every user (mode 1777)"),
    ("another user's link", _foreign_link, "symbolic link that belongs to user nobody"),
    ("another user's folder far up", _foreign_parent_far_up, "belongs to user nobody"),
]


def _refused_untouched(cli, work, make, problem: str, tail: str) -> tuple[str, str]:
    """Submit with the --output-dir that ``make`` builds: one error line naming it and ``problem``, nothing created
    or submitted. Returns (the line, stdout)."""
    output_dir = make(work)
    before = _tree(work)
    code, out, err = _submit(cli, "--output-dir", output_dir)
    line = one_error_line(code, err, f"--output-dir {output_dir}: ", problem, tail)
    assert _tree(work) == before  # nothing created, nothing submitted
    return line, out


@pytest.mark.parametrize("make, problem", [u[1:] for u in UNTRUSTED], ids=[u[0] for u in UNTRUSTED])
def test_a_jobs_folder_another_user_can_change_is_refused(cli, work, make, problem):
    _, out = _refused_untouched(cli, work, make, problem, "docs/submission.md")
    assert out == ""


def test_the_default_jobs_folder_under_a_folder_others_can_write(cli, work):
    work.chmod(0o777)
    code, out, err = _submit(cli)
    one_error_line(code, err, "jobs folder hpcvod-jobs: ", f"{work} can be written by every user")
    assert not (work / "hpcvod-jobs").exists()


def test_a_sticky_parent_and_links_of_our_own_are_fine(cli, work):
    (work / "scratch").mkdir()
    (work / "scratch").chmod(0o1777)  # /tmp-style: nobody may rename or remove what is not theirs
    (work / "scratch" / "me").mkdir(mode=0o700)
    os.symlink(work / "scratch" / "me", work / "link")
    code, out, err = _submit(cli, "--output-dir", "link/jobs")
    assert code == 0, err
    (job_dir,) = (work / "scratch" / "me" / "jobs").iterdir()
    assert f"folder: {job_dir}" in out  # the real path, links resolved once, during the check
    assert _mode(work / "scratch" / "me" / "jobs") == 0o700


def test_the_python_api_root_is_checked_too(work):
    (work / "theirs").mkdir()
    os.chown(work / "theirs", NOBODY, -1)
    with pytest.raises(UserError, match="belongs to user nobody"):
        ensure_root(work / "theirs" / "jobs")
    assert not (work / "theirs" / "jobs").exists()


def test_a_failed_walk_removes_the_folders_it_made(cli, work):
    code, _, err = _submit(cli, "--output-dir", "new/deeper/" + "x" * 300)
    one_error_line(code, err, "--output-dir new/deeper/", "File name too long")
    assert not (work / "new").exists()


def test_job_files_are_written_into_the_folder_that_was_opened(work):
    """Swapping the jobs folder after the check changes nothing: hpcvod writes relative to what it opened."""
    with open_new_job_dir(work / "jobs", "train") as new:
        os.rename(work / "jobs", work / "moved")
        (work / "jobs").mkdir()  # a look-alike, where a path lookup would now land
        write_job_file(new.path / "request.json", "{}\n", folder_fd=new.fd)
        assert (work / "moved" / new.path.name / "request.json").read_text() == "{}\n"
        assert _tree(work / "jobs") == []
        assert _mode(work / "moved" / new.path.name / "request.json") == 0o600


def test_another_user_cannot_swap_the_jobs_folder_hpcvod_created(cli, work, umask000, users):
    """The attack of issue 23 replayed with a second real user: with umask 000, `proj` and `proj/runs` used to be
    0777, and the other user renamed `jobs` away to put their own in its place."""
    shared = Path(tempfile.mkdtemp(prefix="hpcvod-trust-"))  # not pytest's tmp_path: that is private to root
    try:
        shared.chmod(0o755)  # every user can enter, as a project file system
        code, _, err = _submit(cli, "--output-dir", str(shared / "proj" / "runs" / "jobs"))
        assert code == 0, err
        runs = shared / "proj" / "runs"
        for argv in (["mv", str(runs / "jobs"), str(runs / "stolen")], ["mkdir", str(runs / "mine")]):
            done = _as(PEER, *argv)
            assert done.returncode != 0 and "Permission denied" in done.stderr, done
        assert sorted(os.listdir(runs)) == ["jobs"]
    finally:
        shutil.rmtree(shared, ignore_errors=True)


# ---- item 13: an --output-dir that is no folder ----------------------------------------------------------


def _a_file(work: Path) -> str:
    (work / "f").write_text("x")
    return "f"


def _under_a_file(work: Path) -> str:
    (work / "f").write_text("x")
    return "f/jobs"


def _a_fifo(work: Path) -> str:
    os.mkfifo(work / "fifo")
    return "fifo"


NOT_A_FOLDER = [("a file", _a_file, "f is a file"), ("under a file", _under_a_file, "f is a file"),
                ("/dev/null", lambda work: "/dev/null", "/dev/null is a character device"),
                ("a FIFO", _a_fifo, "fifo is a FIFO")]


@pytest.mark.parametrize("make, problem", [n[1:] for n in NOT_A_FOLDER], ids=[n[0] for n in NOT_A_FOLDER])
def test_an_output_dir_that_is_no_folder_is_one_line(cli, work, make, problem):
    line, _ = _refused_untouched(cli, work, make, problem, "expected a folder")
    assert "Errno" not in line


# ---- item 3: files of a job folder are read never through a symbolic link -----------------------------------

SECRET = "TOPSECRET-4242"


def _unused_pid() -> int:
    pid = int(Path("/proc/sys/kernel/pid_max").read_text()) - 1
    while Path(f"/proc/{pid}").exists():
        pid -= 1
    return pid


def _finished_job(root: Path, name: str = "job-1", plan: dict | None = None) -> Path:
    """A local job folder as submit leaves it once the job has ended (its pid long gone, exit status 0)."""
    folder = root / "hpcvod-jobs" / name
    folder.mkdir(parents=True)
    pid = _unused_pid()
    (folder / "job.json").write_text(json.dumps({"job_id": f"local-{pid}", "scheduler": "local", "pid": pid,
                                                 "pgid": pid, "start_time": 1}))
    (folder / "request.json").write_text(json.dumps({"plan": {"site": "local", "scheduler": "local",
                                                              "site_source": "", **(plan or {})}}))
    (folder / "output.log").write_text("[0]<stdout>: hello\n")
    (folder / "exitcode").write_text("0\n")
    return folder


def _secret_file(tmp_path: Path, name: str) -> Path:
    """Another file hpcvod must not print: here one that is itself a valid job file, holding the secret."""
    secret = tmp_path / "elsewhere" / name
    secret.parent.mkdir(exist_ok=True)
    text = {"job.json": json.dumps({"job_id": SECRET}), "request.json": json.dumps({"plan": {"site": SECRET}}),
            "exitcode": "0\n"}.get(name, f"[0]<stdout>: {SECRET}\n")
    secret.write_text(text)
    return secret


LINKED = ["output.log", "job.json", "request.json", "exitcode", "output.0.log", "data-service.log"]


@pytest.mark.parametrize("name", LINKED)
@pytest.mark.parametrize("command", ["logs", "status", "jobs"])
def test_a_symlink_in_a_job_folder_is_never_read_through(cli, tmp_path, name, command):
    folder = _finished_job(tmp_path)
    if name == "output.0.log":  # an array job's task log (no output.log)
        (folder / "output.log").unlink()
    (folder / name).unlink(missing_ok=True)
    os.symlink(_secret_file(tmp_path, name), folder / name)
    code, out, err = cli(command, *([] if command == "jobs" else [str(folder)]))
    assert SECRET not in out + err
    if command == "jobs":
        if name in ("output.log", "job.json", "request.json", "exitcode"):  # the files a row reads
            assert code == 0 and "BROKEN" in out and "symbolic link" in out, (out, err)
    elif command == "logs" or name not in ("output.0.log", "data-service.log"):
        one_error_line(code, err, str(folder / name), "it is a symbolic link, expected a regular file")


def test_logs_do_not_print_this_process_environment(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("HPCVOD_TEST_MARKER", SECRET)
    folder = _finished_job(tmp_path)
    (folder / "output.log").unlink()
    os.symlink("/proc/self/environ", folder / "output.log")
    code, out, err = cli("logs", str(folder))
    assert SECRET not in out + err
    one_error_line(code, err, "output.log", "symbolic link")


def test_a_fifo_output_log_is_refused_without_waiting(cli, tmp_path):
    folder = _finished_job(tmp_path)
    (folder / "output.log").unlink()
    os.mkfifo(folder / "output.log")  # nobody writes to it: a plain open would block for ever
    code, out, err = cli("logs", str(folder))
    one_error_line(code, err, "output.log", "it is a FIFO")


def test_the_python_api_reads_a_job_folder_the_same_way(tmp_path):
    from hpcvod.jobs.python_api import HpcvodJob

    folder = _finished_job(tmp_path)
    ref = ref_from_dir(folder)
    job = HpcvodJob(folder=folder, job_id=ref.job_id, ref=ref)
    assert job.stdout() == "[0]<stdout>: hello\n"
    (folder / "output.log").unlink()
    os.symlink(_secret_file(tmp_path, "output.log"), folder / "output.log")
    with pytest.raises(UserError, match="symbolic link"):
        job.stdout()


# ---- item 4: what is printed from a job folder is shown escaped ------------------------------------------

# ESC[2J clears the screen, an OSC sets the window title, CSI as one C1 byte, a newline splits a table row, a
# right-to-left override turns text around, a lone surrogate (a name that is not UTF-8) cannot even be printed
HOSTILE = "x\x1b[2J\x1b]0;pwned\x07\x9b31m\nFAKE ROW\u202eZ"
RAW = ("\x1b", "\x07", "\x9b", "\u202e")


def _hostile_job(root: Path) -> Path:
    folder = _finished_job(root, name="job" + HOSTILE, plan={"site": "site" + HOSTILE})
    record = json.loads((folder / "job.json").read_text())
    (folder / "job.json").write_text(json.dumps({**record, "submitted": "2026-11-25T10:00:00" + HOSTILE}))
    return folder


def _assert_escaped(text: str) -> None:
    assert not any(c in text for c in RAW), repr(text)
    assert "\\x1b[2J" in text and "\\x1b]0;pwned\\x07" in text


def test_jobs_shows_control_characters_escaped(cli, tmp_path):
    _hostile_job(tmp_path)
    os.mkdir(tmp_path / "hpcvod-jobs" / ("broken" + HOSTILE))  # a BROKEN row: its note names the folder
    (tmp_path / "hpcvod-jobs" / ("broken" + HOSTILE) / "request.json").write_text("[]")
    code, out, err = cli("jobs")
    assert code == 0, err
    _assert_escaped(out)
    lines = out.splitlines()
    assert len(lines) == 4, out  # the header, two rows, the broken folder's note: no row split by a newline
    assert "FAKE ROW" not in "".join(line[:3] for line in lines)


def test_status_shows_control_characters_escaped(cli, tmp_path):
    folder = _hostile_job(tmp_path)
    code, out, err = cli("status", str(folder))
    assert code == 0, err
    _assert_escaped(out)
    assert len(out.splitlines()) == 1, out


def test_logs_headers_show_control_characters_escaped(cli, tmp_path):
    folder = _hostile_job(tmp_path)
    (folder / "output.log").unlink()  # no output yet: the line names the folder
    code, out, err = cli("logs", str(folder))
    assert code == 0, err
    _assert_escaped(err)
    assert len(err.splitlines()) == 1, err


def test_a_folder_name_that_is_not_utf8_is_printed(cli, tmp_path):
    folder = _finished_job(tmp_path, name=os.fsdecode(b"job-\xff\xfe"))
    code, out, err = cli("jobs")
    assert code == 0, err
    assert "job-\\udcff\\udcfe" in out


# ---- item 12: `logs --rank N` is linear on long lines ------------------------------------------------------

RANK_LOG = ("[1]<stdout>: one é\n[11]<stdout>: eleven\n[0]<stderr>: zero\nno label\n[1]<stderr>:\n"
            "[1]<stdout>:" + "x" * 50 + "\n[10]<stdout>: ten\n[1]<stdout>: last, no newline é")


def _rank_lines(text: str, rank: int) -> str:
    """What `logs --rank` must print: the whole lines whose label is rank's, each ending in a newline."""
    from hpcvod.launchers.label import LABELLED

    return "".join(line + "\n" for line in text.split("\n")
                   if (m := LABELLED.match(line)) and m.group(1) == str(rank))


@pytest.mark.parametrize("rank", [0, 1, 10, 11, 2])
def test_the_rank_filter_splits_correctly_wherever_the_reads_cut(rank):
    from hpcvod.jobs.watch import _RankFilter

    want = _rank_lines(RANK_LOG, rank)
    for cut in range(len(RANK_LOG) + 1):
        for step in (None, 1, 3):  # one cut, or pieces of `step` characters after it
            keep = _RankFilter(rank)
            pieces = [RANK_LOG[:cut]] + ([RANK_LOG[cut:]] if step is None else
                                         [RANK_LOG[i:i + step] for i in range(cut, len(RANK_LOG), step)])
            got = "".join(keep(piece) for piece in pieces) + keep("", final=True)
            assert got == want, (cut, step)


@pytest.mark.parametrize("chunk", [1, 2, 5, 4096])
def test_logs_rank_reads_in_chunks_of_any_size(cli, tmp_path, monkeypatch, chunk):
    """Through the real command, with reads of `chunk` bytes (a 2-byte character cut in two, labels cut)."""
    monkeypatch.setattr("hpcvod.jobs.watch.READ_CHUNK", chunk)
    folder = _finished_job(tmp_path)
    long_line = "[1]<stdout>: " + "y" * 10_000  # far longer than a read, no newline
    (folder / "output.log").write_text(RANK_LOG + "\n" + long_line, encoding="utf-8")
    for rank in (1, 11):
        code, out, err = cli("logs", "--rank", str(rank), str(folder))
        assert code == 0, err
        assert out == _rank_lines(RANK_LOG + "\n" + long_line, rank)


def test_a_long_line_of_the_rank_is_passed_on_as_it_comes():
    """Not held whole until its newline (which made each read copy everything before it again: quadratic)."""
    from hpcvod.jobs.watch import _RankFilter

    keep, other = _RankFilter(1), _RankFilter(2)
    piece = "z" * 1000
    assert keep("[1]<stdout>: ") + keep(piece) == "[1]<stdout>: " + piece
    assert keep(piece) == piece and keep.head == ""
    assert other("[1]<stdout>: ") + other(piece) + other(piece) == "" and other.head == ""
    assert keep("\n[2]<stdout>: b\n", final=True) == "\n"
    assert other("\n[2]<stdout>: b\n", final=True) == "[2]<stdout>: b\n"


# ---- issue 25, the small ones of `logs` and `jobs` ---------------------------------------------------------


def test_logs_rank_beyond_the_job_is_one_line(cli, tmp_path):
    folder = _finished_job(tmp_path, plan={"world_size": 2})
    code, out, err = cli("logs", "--rank", "5", str(folder))
    one_error_line(code, err, "logs: --rank 5: job local-", "has ranks 0-1")
    assert out == ""
    code, out, err = cli("logs", "--rank", "0", str(folder))
    assert code == 0 and out == "[0]<stdout>: hello\n", err
    alone = _finished_job(tmp_path, name="job-2", plan={"world_size": 1})
    one_error_line(*cli("logs", "--rank", "1", str(alone))[::2], "has rank 0 only")


@pytest.mark.parametrize("command", ["jobs", "logs", "status"])
def test_a_reader_that_has_gone_is_no_error(tmp_path, command):
    """`hpcvod jobs | head -1`: here a pipe whose reading end is closed before hpcvod writes (EPIPE for sure)."""
    from submission_helpers import clean_env

    folder = _finished_job(tmp_path)
    (folder / "output.log").write_text("[0]<stdout>: hello\n" * 20_000)  # more than a pipe holds
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run([sys.executable, "-m", "hpcvod.cli", command, *([] if command == "jobs" else
                                                                              [str(folder)])],
                              cwd=tmp_path, env=clean_env(tmp_path), stdout=write_end, stderr=subprocess.PIPE,
                              text=True, timeout=60)
    finally:
        os.close(write_end)
    assert done.returncode == 0 and done.stderr == "", done


# ---- property-based: control characters in job folders, links and foreign owners ---------------------------
# (the classes of issue 23 for the generators of test_hostile_inputs.py; its harness is reused, not copied)

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from test_hostile_inputs import SETTINGS, TEXT, assert_contract, run_cli  # noqa: E402

CONTROL = st.lists(st.sampled_from(["\x1b[2J", "\x1b]0;t\x07", "\x9b", "\x07", "\n", "\r", "\t", "\x7f", "\x85",
                                   "\u2028", "\u202e", "\x00", "a", "é", " "]), min_size=1, max_size=6).map("".join)
HOSTILE_TEXT = st.one_of(CONTROL, TEXT)
JOB_FILES = ["job.json", "request.json", "exitcode", "output.log", "cancelled"]
SHOWN_RAW = ("\x1b", "\x07", "\x9b", "\u202e", "\u2028", "\x85")


@st.composite
def hostile_job_folders(draw) -> dict:
    """A finished local job folder whose name and shown fields hold control characters, with some of its files
    replaced by a link to a secret, and some of them (or the folder) given to another user."""
    return {"name": "job" + draw(CONTROL).replace("/", "").replace("\x00", ""),
            "site": draw(HOSTILE_TEXT), "submitted": draw(HOSTILE_TEXT),
            "links": draw(st.lists(st.sampled_from(JOB_FILES), unique=True, max_size=2)),
            "foreign": draw(st.lists(st.sampled_from(JOB_FILES + ["."]), unique=True, max_size=2))}


@settings(max_examples=80, **SETTINGS)
@given(folder=hostile_job_folders(), command=st.sampled_from(["status", "logs", "jobs", "cancel"]))
def test_hostile_job_folders_print_nothing_raw_and_no_secret(folder, command):
    work = Path(tempfile.mkdtemp(prefix="hpcvod-trust-prop-"))
    cwd = os.getcwd()
    try:
        os.chdir(work)
        try:
            job_dir = _finished_job(work, name=folder["name"], plan={"site": folder["site"]})
        except OSError:  # a name the file system refuses (too long): nothing to test
            return
        record = json.loads((job_dir / "job.json").read_text())
        (job_dir / "job.json").write_text(json.dumps({**record, "submitted": folder["submitted"]}))
        for name in folder["links"]:
            (job_dir / name).unlink(missing_ok=True)
            os.symlink(_secret_file(work, name), job_dir / name)
        for name in folder["foreign"]:
            if (job_dir / name).exists():
                os.lchown(job_dir / name, NOBODY, NOBODY)
        argv = [command] + ([] if command == "jobs" else [str(job_dir)])
        code, out, err, elapsed = run_cli(argv)
        assert_contract(argv, code, err, elapsed)
        assert SECRET not in out + err, (argv, out, err)
        assert not any(c in out + err for c in SHOWN_RAW), (argv, out, err)
    finally:
        os.chdir(cwd)
        shutil.rmtree(work, ignore_errors=True)


def _trusted_chain(path: Path) -> bool:
    """Checked apart from hpcvod's walk: every folder from / to ``path`` (links resolved) is root's and writable
    by nobody else, sticky folders above ``path`` aside."""
    real = Path(os.path.realpath(path))
    for folder in [*reversed(real.parents), real]:
        st_ = os.lstat(folder)
        if st_.st_uid != os.geteuid() and st_.st_uid != 0:
            return False
        sticky = st_.st_mode & stat.S_ISVTX and folder != real
        if st_.st_mode & 0o022 and not sticky:
            return False
    return True


@st.composite
def jobs_folder_trees(draw) -> list[tuple[str, str]]:
    """Up to four steps below the example's folder, each a folder (private, world-writable, sticky, group-writable,
    another user's), a link to the step before (ours or another user's), a file or a FIFO."""
    kinds = ["dir", "dir", "dir0777", "dir1777", "dir0775g", "foreign", "link", "foreignlink", "file", "fifo"]
    return [(f"s{i}", draw(st.sampled_from(kinds))) for i in range(draw(st.integers(0, 4)))]


@settings(max_examples=80, **SETTINGS)
@given(tree=jobs_folder_trees(), missing=st.integers(0, 2), shared=st.booleans())
def test_a_job_folder_is_made_only_under_folders_nobody_else_can_change(tree, missing, shared):
    work = Path(tempfile.mkdtemp(prefix="hpcvod-trust-prop-"))
    try:
        path = work
        for name, kind in tree:
            if not path.is_dir():
                break  # nothing can be made under a file or a FIFO
            target = path / name
            if kind.startswith("dir") or kind == "foreign":
                target.mkdir()
                if kind == "foreign":
                    os.chown(target, NOBODY, -1)
                elif kind != "dir":
                    os.chown(target, -1, NOBODY if kind.endswith("g") else -1)
                    target.chmod(int(kind[3:7], 8))
            elif kind in ("link", "foreignlink"):
                os.symlink(path, target)
                if kind == "foreignlink":
                    os.lchown(target, NOBODY, -1)
            elif kind == "file":
                target.write_text("x")
            else:
                os.mkfifo(target)
            path = target
        root = path.joinpath(*[f"new{i}" for i in range(missing)])
        before = _tree(work)
        try:
            with open_new_job_dir(root, "train", shared=shared) as new:
                made = new.path
        except UserError as err:
            assert "\n" not in str(err) and str(root) in str(err)
            assert _tree(work) == before  # refused: nothing made
            return
        assert _trusted_chain(made.parent), (tree, made)
        assert stat.S_IMODE(os.stat(made).st_mode) == (0o750 if shared else 0o700)
    finally:
        shutil.rmtree(work, ignore_errors=True)
