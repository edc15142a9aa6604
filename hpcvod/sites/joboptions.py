"""Per-job scheduler options (``submit --mem 64G --qos high ...``): their format, defined once.

The same dataclasses give the CLI flags (``--`` + the field name with dashes), the Python API's parameters (the
field names), the partition defaults of a site profile (``partitions.<name>.job_defaults``, checked by
hpcvod/sites/spec.py like every profile key) and the checks of every value. Each scheduler module says how it
writes them as directives, or refuses the ones its batch system has not (hpcvod/schedulers/*.py).
"""

from __future__ import annotations

import dataclasses
import datetime
import re
import unicodedata
from dataclasses import dataclass
from typing import Annotated, Any, Optional

from hpcvod.support.errors import ProfileError, UserError
from hpcvod.sites.spec import CONTROL_CHARS, Pattern, doc, from_data

SIZE = Pattern(r"[1-9][0-9]{0,9}[KMGT]?", "a size: a whole number of megabytes, or one with a K, M, G or T "
               "suffix, e.g. 64G")
NAME = Pattern(r"[A-Za-z0-9][A-Za-z0-9_.+@-]*", "a name of letters, digits and _ . + @ -")
_RANGE = r"[0-9]{1,9}(-[0-9]{1,9})?"
_HOST = rf"[A-Za-z0-9][A-Za-z0-9_.-]*(\[{_RANGE}(,{_RANGE})*\])?"
NODES = Pattern(rf"{_HOST}(,{_HOST})*", "host names or ranges separated by commas, e.g. n[01-04],gpu7")
_FEATURE = r"\(*[A-Za-z0-9_.-]+(\*[0-9]+)?\)*"
CONSTRAINT = Pattern(rf"\[?{_FEATURE}([&|,]{_FEATURE})*\]?",
                     "node features joined by & (and), | (or) or , e.g. a100&ib or [rack1|rack2]")
BEGIN = Pattern(r"now\+[0-9]{1,9}(seconds|minutes|hours|days)?"
                r"|[0-9]{4}-[0-9]{2}-[0-9]{2}(T[0-9]{2}:[0-9]{2}(:[0-9]{2})?)?",
                "a start time as YYYY-MM-DD[THH:MM[:SS]] or now+N[seconds|minutes|hours|days]")
MAIL_TYPE_WORDS = ("NONE", "BEGIN", "END", "FAIL", "REQUEUE", "ALL", "INVALID_DEPEND", "STAGE_OUT", "TIME_LIMIT",
                   "TIME_LIMIT_90", "TIME_LIMIT_80", "TIME_LIMIT_50", "ARRAY_TASKS")
_WORD = "|".join(sorted(MAIL_TYPE_WORDS, key=len, reverse=True))
MAIL_TYPE = Pattern(rf"({_WORD})(,({_WORD}))*", f"mail events separated by commas: {', '.join(MAIL_TYPE_WORDS)}")
MAIL_USER = Pattern(r"[A-Za-z0-9._%+-]+(@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*)?", "a mail address or a user name")
DEPENDENCY_KINDS = ("after", "afterany", "afterok", "afternotok")
_ID = r"[A-Za-z0-9_.+\[\]/~-]+"
_ONE_DEPENDENCY = rf"(singleton|({'|'.join(DEPENDENCY_KINDS)})(:{_ID})+)"
DEPENDENCY = Pattern(rf"{_ONE_DEPENDENCY}(,{_ONE_DEPENDENCY})*",
                     "Slurm's dependency grammar: afterok:ID[:ID...], afterany:ID, afternotok:ID, after:ID or "
                     "singleton, joined by commas; an ID is a job id, a job folder or a job folder's name")
ARRAY = Pattern(r"[0-9]{1,7}(-[0-9]{1,7}(:[0-9]{1,7})?)?(,[0-9]{1,7}(-[0-9]{1,7}(:[0-9]{1,7})?)?)*(%[0-9]{1,7})?",
                "array indexes as a range, a list or both, with an optional %MAX running at once: "
                "0-9, 1,3,5, 0-15:2 or 0-15%4")
# A value that lands in a directive is one word of it. A scheduler splits a directive line on whitespace and reads
# every word (sbatch took 'comment=x --uid=0' as two options), so no value may hold any, of any kind (str.isspace:
# Unicode spaces, line and paragraph separators, \x1c-\x1f), nor a control character (NUL, ESC...), an invisible
# format character (zero-width spaces, bidi overrides) or a lone surrogate that would end, hide or disguise the
# line. word_problem() is the check; WORD_CHAR says the same, for the common ones, in the patterns and the schema.
_NOT_A_WORD_CATEGORIES = ("Zs", "Zl", "Zp", "Cc", "Cf", "Cs")
_NOT_IN_A_WORD = rf"\s{CONTROL_CHARS}\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ud800-\udfff"
WORD_CHAR = f"[^{_NOT_IN_A_WORD}]"
# one directive: KEY or KEY=VALUE; quoting is the only way to hold characters a shell would act on
# (a VALUE may not start with '-': written apart from a one-letter KEY, `-h -V`, it would be another option)
SCHED_OPT = Pattern(rf"[A-Za-z][A-Za-z0-9_-]*(=[^-{_NOT_IN_A_WORD}]{WORD_CHAR}*)?", "KEY or KEY=VALUE, one "
                    "directive without the #SBATCH/#PBS prefix, without leading dashes and without whitespace or "
                    "control characters, e.g. gres-flags=enforce-binding")
_UNQUOTED_SPECIAL = re.compile(r"[;&|<>`$\\(){}!*?#\"']")
_QUOTED = re.compile(r"'[^']*'|\"[^\"$`\\]*\"")
# the start times a scheduler can express: qsub's -a takes a four-digit year, and the clocks count from 1970
EARLIEST_BEGIN = datetime.datetime(1970, 1, 1)
MAX_ARRAY_TASKS = 100_000


@dataclass(frozen=True)
class JobDefaults:
    """Scheduler options a job may ask for, which a partition may also set for every job it runs (a user's flag
    beats the partition's value)."""

    exclusive: Optional[bool] = doc("whole nodes for this job alone", None)
    mem: Optional[Annotated[str, SIZE]] = doc("memory per node", None)
    mem_per_gpu: Optional[Annotated[str, SIZE]] = doc("memory per allocated GPU (Slurm only)", None)
    constraint: Optional[Annotated[str, CONSTRAINT]] = doc("node features the job needs", None)
    qos: Optional[Annotated[str, NAME]] = doc("quality of service (Slurm only)", None)
    reservation: Optional[Annotated[str, NAME]] = doc("run inside this reservation", None)
    nodelist: Optional[Annotated[str, NODES]] = doc("run on these nodes (Slurm only)", None)
    exclude: Optional[Annotated[str, NODES]] = doc("never run on these nodes (Slurm only)", None)
    mail_type: Optional[Annotated[str, MAIL_TYPE]] = doc("when to send mail", None)
    mail_user: Optional[Annotated[str, MAIL_USER]] = doc("who gets the mail", None)
    sched_opt: list[Annotated[str, SCHED_OPT]] = doc(
        "other directives, KEY or KEY=VALUE each (repeatable); a partition's come before the user's", factory=list)


@dataclass(frozen=True)
class JobOptions(JobDefaults):
    """All per-job scheduler options: the partition defaults plus what only one job can mean."""

    begin: Optional[Annotated[str, BEGIN]] = doc("start no earlier than this", None)
    dependency: Optional[Annotated[str, DEPENDENCY]] = doc(
        "start after other jobs (Slurm's grammar; an ID may be a job folder)", None)
    array: Optional[Annotated[str, ARRAY]] = doc("run as an array of tasks, each seeing HPCVOD_ARRAY_INDEX", None)


# what each option's value looks like, for --help (None: a flag without a value)
METAVAR = {"exclusive": None, "mem": "SIZE", "mem_per_gpu": "SIZE", "constraint": "EXPR", "qos": "NAME",
           "reservation": "NAME", "nodelist": "NODES", "exclude": "NODES", "mail_type": "TYPES", "mail_user": "ADDR",
           "sched_opt": "KEY[=VALUE]", "begin": "TIME", "dependency": "EXPR", "array": "SPEC"}


def option_help() -> list[tuple[str, str | None, str]]:
    """(field name, metavar, help) of every option, in the order the format declares them (the CLI's flags)."""
    return [(f.name, METAVAR[f.name], f.metadata["doc"]) for f in dataclasses.fields(JobOptions)]


def flag(field_name: str) -> str:
    """The CLI flag of an option field."""
    return "--" + field_name.replace("_", "-")


def option_names() -> list[str]:
    return [f.name for f in dataclasses.fields(JobOptions)]


def job_options(values: dict[str, Any]) -> JobOptions:
    """A checked JobOptions from the given values (None = not given); every bad value is a UserError naming the
    flag, the value and what was expected."""
    given = {k: v for k, v in values.items() if v is not None and v != [] and v != ()}
    if "sched_opt" in given and isinstance(given["sched_opt"], (tuple, str)):
        given["sched_opt"] = [given["sched_opt"]] if isinstance(given["sched_opt"], str) else list(given["sched_opt"])
    for name, value in given.items():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str):  # before the patterns: what is wrong, said precisely
                check_sched_opt(item) if name == "sched_opt" else check_one_word(flag(name), item)
    try:
        options = from_data(JobOptions, given)
    except ProfileError as err:
        name = str(err.key_path[0]) if err.key_path else ""
        if name not in given:  # an unknown option: the spec says which ones there are
            raise UserError(f"job option {name!r}: {err.message}") from None
        value = given[name]
        if len(err.key_path) > 1 and isinstance(err.key_path[1], int):
            value = value[err.key_path[1]]
        raise UserError(f"{flag(name)} {value!r}: {err.message.split(', got ')[0]}") from None
    check_job_options(options)
    return options


def word_problem(text: str) -> str | None:
    """What keeps ``text`` from being one word of a directive line: its first whitespace, control or format
    character, named by code point (None: nothing)."""
    at, char = next(((i, c) for i, c in enumerate(text)
                     if c.isspace() or unicodedata.category(c) in _NOT_A_WORD_CATEGORIES), (-1, ""))
    if not char:
        return None
    if char.isspace():
        kind, why = "whitespace", "the scheduler would read what follows as another option"
    elif unicodedata.category(char) == "Cc":
        kind, why = "a control character", "it would end or garble the directive line"
    elif unicodedata.category(char) == "Cs":
        kind, why = "an undecodable byte", "it is no text a scheduler reads"
    else:
        kind, why = "an invisible format character", "it would hide part of the directive line"
    return f"{kind} (U+{ord(char):04X}) at character {at + 1} is not allowed: {why}"


def check_one_word(flag_name: str, value: str) -> None:
    """Refuse (UserError, one line) a value that would not stay one word of its directive line."""
    problem = word_problem(value)
    if problem is not None:
        raise UserError(f"{flag_name} {value!r}: expected one directive value; {problem}")


def check_job_options(options: JobDefaults) -> None:
    """What the patterns alone cannot say: real dates, ordered ranges, balanced expressions, one memory request,
    safe directives."""
    if options.mem is not None and options.mem_per_gpu is not None:
        raise UserError(f"--mem {options.mem} and --mem-per-gpu {options.mem_per_gpu}: expected one of them, "
                        "not both (Slurm takes one memory request)")
    for item in options.sched_opt:
        check_sched_opt(item)
    if options.constraint is not None:
        check_constraint(options.constraint)
    for name in ("nodelist", "exclude"):
        if getattr(options, name) is not None:
            check_host_ranges(flag(name), getattr(options, name))
    if isinstance(options, JobOptions):
        if options.begin is not None:
            begin_datetime(options.begin)
        if options.array is not None:
            array_indexes(options.array)


def check_sched_opt(item: str) -> None:
    """One directive: one word, no character a shell acts on unless it stands inside quotes. What a scheduler
    reads as a directive of its own is its module's check (Scheduler.check_sched_opt)."""
    check_one_word("--sched-opt", item)
    value = item.partition("=")[2]
    rest = _QUOTED.sub("", value)
    bad = _UNQUOTED_SPECIAL.search(rest)
    if bad or not re.fullmatch(SCHED_OPT.regex, item):
        what = (f"{bad.group()!r} outside quotes" if bad else "a VALUE that starts with '-' (after a one-letter "
                "KEY the scheduler reads it as another option)" if value.startswith("-") else "its form")
        raise UserError(f"--sched-opt {item!r}: expected {SCHED_OPT.meaning}; {what} is not allowed")


def check_constraint(text: str) -> None:
    """``--constraint``: every ( closed by a ) after it, and a [ at the start only with a ] at the end (the
    pattern has said the rest: features between the operators, none empty)."""
    depth = 0
    for char in text:
        depth += (char == "(") - (char == ")")
        if depth < 0:
            break
    if depth != 0 or text.startswith("[") != text.endswith("]"):
        raise UserError(f"--constraint {text!r}: expected {CONSTRAINT.meaning}, with each ( closed by a ) and a "
                        "[ at the start closed by a ] at the end")


def check_host_ranges(flag_name: str, text: str) -> None:
    """``--nodelist``/``--exclude``: each range in brackets counts up (n[5-1] names no host)."""
    for ranges in re.findall(r"\[([0-9,-]+)\]", text):
        for part in ranges.split(","):
            first, _, last = part.partition("-")
            if last and int(last) < int(first):
                raise UserError(f"{flag_name} {text!r}: range {part!r}: expected FIRST-LAST with LAST >= FIRST")


def begin_datetime(text: str) -> datetime.datetime | None:
    """The absolute start time of ``--begin`` (None for now+N, which only Slurm reads); a date that does not
    exist, or one before 1970 (no scheduler can express it), is a UserError."""
    if text.startswith("now+"):
        return None
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise UserError(f"--begin {text!r}: expected {BEGIN.meaning} (a date and time that exist)") from None
    if when < EARLIEST_BEGIN:
        raise UserError(f"--begin {text!r}: expected a time from {EARLIEST_BEGIN:%Y-%m-%d} on (the schedulers "
                        "count time from 1970)")
    return when


def array_indexes(spec: str) -> tuple[list[int], int | None]:
    """The indexes of ``--array SPEC`` in order, and its %MAX (None when not given)."""
    body, _, limit = spec.partition("%")
    indexes: list[int] = []
    for part in body.split(","):
        first, _, rest = part.partition("-")
        last, _, step = rest.partition(":")
        start, end, stride = int(first), int(last or first), int(step or 1)
        if end < start or stride < 1:
            raise UserError(f"--array {spec!r}: range {part!r}: expected START-END with END >= START and a step >= 1")
        if len(indexes) + (end - start) // stride + 1 > MAX_ARRAY_TASKS:
            raise UserError(f"--array {spec!r}: expected at most {MAX_ARRAY_TASKS} tasks")
        indexes.extend(range(start, end + 1, stride))
    if len(set(indexes)) != len(indexes):
        raise UserError(f"--array {spec!r}: expected each index once")
    if limit and int(limit) < 1:
        raise UserError(f"--array {spec!r}: expected %MAX >= 1")
    return indexes, int(limit) if limit else None


def merged(defaults: JobDefaults, options: JobOptions) -> JobOptions:
    """The job's options: the partition's defaults where the user gave nothing, the partition's extra
    directives first (a scheduler takes the last of a repeated directive: the user's)."""
    changes: dict[str, Any] = {}
    memory = ("mem", "mem_per_gpu")  # one memory request: the user's, in whichever form, replaces the partition's
    user_memory = any(getattr(options, name) is not None for name in memory)
    for f in dataclasses.fields(JobDefaults):
        mine, theirs = getattr(options, f.name), getattr(defaults, f.name)
        if f.name in memory and user_memory:
            continue
        if f.name == "sched_opt":
            changes[f.name] = [*theirs, *mine]
        elif mine is None and theirs is not None:
            changes[f.name] = theirs
    return dataclasses.replace(options, **changes)
