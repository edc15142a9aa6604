"""Property-based: directives smuggled inside values (issue 23). Whatever a user or a partition default puts in a
value that lands in a scheduler directive, for every scheduler:

  - a value holding whitespace of any kind, a control or an invisible format character (with or without an
    option-looking word after it) is refused in one line naming the flag and the value, and nothing renders;
  - a value that is accepted renders as exactly one directive line, whose only word that starts with '-' is the
    option itself: no scheduler can read a second option out of it.

Examples are derandomized and few, so the file runs the same everywhere in seconds.
"""

from __future__ import annotations

import sys
import unicodedata

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from submission_helpers import NO_USER_CONFIG, golden_host, load_site
from hpcvod.jobs.plan import resolve
from hpcvod.jobs.render import render
from hpcvod.jobs.spec import JobSpec
from hpcvod.schedulers import scheduler_for
from hpcvod.sites import UserError
from hpcvod.sites.joboptions import flag, job_options

SETTINGS = dict(deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
SITES = ["slurm-ib-openmpi", "pbs-ib-openmpi", "sge-sandbox", "local"]
# a value each option accepts, into which the strategies put what a scheduler would split on
VALID = {"mem": "64G", "mem_per_gpu": "8G", "constraint": "a100&ib", "qos": "high", "reservation": "42",
         "nodelist": "n[01-04]", "exclude": "n7", "begin": "2030-01-01T10:00", "mail_type": "BEGIN,END",
         "mail_user": "ada@example.org", "dependency": "afterok:12", "array": "1-9", "sched_opt": "comment=sweep"}
# every character that may not stand in a directive value: whitespace of any kind (str.isspace: Unicode spaces,
# line and paragraph separators, \x1c-\x1f), control characters (NUL included), the invisible format characters
BAD_CHARS = sorted({chr(c) for c in range(sys.maxunicode + 1)
                    if chr(c).isspace() or unicodedata.category(chr(c)) in ("Zs", "Zl", "Zp", "Cc")}
                   | set("\u00ad\u061c\u180e\u200b\u200c\u200d\u200e\u200f\u202a\u202e\u2060\u2066\ufeff"))


def _splits(char: str) -> bool:
    """Whether a scheduler, a shell or a terminal could take ``char`` for a word or line boundary, or hide it."""
    return char.isspace() or unicodedata.category(char) in ("Zs", "Zl", "Zp", "Cc", "Cf")


OPTION_WORDS = st.sampled_from(["", "--uid=0", "--export=NONE", "-V", "-l walltime=1:00:00", "#SBATCH --x",
                                "-o /tmp/x", "--output=/etc/passwd"])
NAMES = st.sampled_from(sorted(VALID))


def _site(name: str):
    return load_site(name, environ=NO_USER_CONFIG)


SITE_OBJECTS = {name: _site(name) for name in SITES}


@st.composite
def smuggled(draw) -> tuple[str, str]:
    """(option name, a valid value with a bad character, and maybe an option-looking word, put inside it)."""
    name = draw(NAMES)
    base = VALID[name]
    at = draw(st.integers(0, len(base)))
    inside = draw(st.sampled_from(BAD_CHARS)) + draw(OPTION_WORDS)
    return name, base[:at] + inside + base[at:]


@settings(max_examples=300, **SETTINGS)
@given(case=smuggled())
@example(case=("sched_opt", "comment=x --uid=0"))  # the cases
@example(case=("sched_opt", "comment=x\f--export=NONE"))
@example(case=("sched_opt", "comment=x\v-V"))
@example(case=("sched_opt", "comment=x\x00y"))
def test_a_value_with_whitespace_or_control_characters_is_refused(case):
    name, value = case
    with pytest.raises(UserError) as err:
        job_options({name: [value] if name == "sched_opt" else value})
    text = str(err.value)
    assert text.startswith(f"{flag(name)} {value!r}: "), text
    assert "\n" not in text and text.isprintable(), text


@settings(max_examples=60, **SETTINGS)
@given(site=st.sampled_from(SITES), where=st.sampled_from(["account", "partition"]), char=st.sampled_from(BAD_CHARS),
       word=OPTION_WORDS)
def test_account_and_partition_with_whitespace_are_refused_for_every_scheduler(site, where, char, word):
    value = {"account": "proj", "partition": "gpu"}[where] + char + word
    with pytest.raises(UserError) as err:
        resolve(JobSpec(program="train.py", **{where: value}), SITE_OBJECTS[site], golden_host())
    assert "\n" not in str(err.value) and str(err.value).isprintable(), err.value


def _directive_lines(text: str, prefix: str) -> list[str]:
    lines = []
    for line in text.splitlines()[1:]:
        if line.startswith(prefix + " "):
            lines.append(line[len(prefix) + 1:])
        elif line and not line.startswith("#"):
            break  # sbatch/qsub read directives up to the first command
    return lines


def assert_one_directive_per_line(site: str, options) -> None:
    """Render ``options`` at ``site``; if it is accepted, every directive line holds one option word."""
    try:
        plan = resolve(JobSpec(program="train.py", nodes=1, options=options), SITE_OBJECTS[site], golden_host())
    except UserError as err:
        event(f"{site}: refused by the scheduler")  # --hypothesis-show-statistics: both outcomes are reached
        assert "\n" not in str(err) and str(err).isprintable(), err
        return
    event(f"{site}: rendered")
    scheduler = scheduler_for(SITE_OBJECTS[site])
    lines = _directive_lines(render(plan, scheduler.template), scheduler.directive_prefix)
    assert lines == list(plan.directives) if scheduler.directive_prefix else lines == []
    for line in lines:
        assert not any(_splits(char) for char in line.replace(" ", "")), line
        words = line.split(" ")
        assert all(words), line  # single spaces only
        assert sum(word.startswith("-") for word in words) == 1, line  # the option, and no second one
    for item in options.sched_opt:  # each --sched-opt: exactly one line of its own
        key, _, value = item.partition("=")
        directive = scheduler.sched_opt_directive(key, value if "=" in item else None)
        assert lines.count(directive) == options.sched_opt.count(item), (directive, lines)


# KEY=VALUE that are often accepted: keys of every form, values of printable characters with now and then one a
# scheduler would split on
KEYS = st.one_of(st.sampled_from(["comment", "gres-flags", "l", "W", "ac", "h", "H", "P", "time-min", "hint"]),
                 st.from_regex(r"[A-Za-z][A-Za-z0-9_-]{0,8}", fullmatch=True))
VALUE_CHARS = st.one_of(st.characters(min_codepoint=0x21, max_codepoint=0x7e), st.characters(),
                        st.sampled_from(BAD_CHARS))
SCHED_OPTS = st.tuples(KEYS, st.one_of(st.none(), st.text(VALUE_CHARS, min_size=1, max_size=12))).map(
    lambda kv: kv[0] if kv[1] is None else f"{kv[0]}={kv[1]}")


@settings(max_examples=200, **SETTINGS)
@given(site=st.sampled_from(SITES), items=st.lists(SCHED_OPTS, min_size=1, max_size=3))
@example(site="slurm-ib-openmpi", items=["comment=\"a;b\"", "gres-flags=enforce-binding"])
@example(site="pbs-ib-openmpi", items=["l=software=matlab", "h"])
@example(site="sge-sandbox", items=["l=h_vmem=4G", "ac=a=1"])
def test_an_accepted_sched_opt_is_one_directive_line(site, items):
    try:
        options = job_options({"sched_opt": items})
    except UserError as err:
        event("refused by its form")
        assert "\n" not in str(err) and str(err).startswith("--sched-opt "), err
        return
    assert_one_directive_per_line(site, options)


@st.composite
def option_values(draw) -> tuple[str, str]:
    """(option name, its valid value as it is, with text around it, or text alone)."""
    name = draw(NAMES.filter(lambda n: n != "sched_opt"))
    text = st.text(VALUE_CHARS, max_size=8)
    value = draw(st.one_of(st.just(VALID[name]), st.tuples(text, text).map(lambda t: t[0] + VALID[name] + t[1]),
                           text))
    return name, value


@settings(max_examples=150, **SETTINGS)
@given(site=st.sampled_from(SITES), case=option_values())
def test_an_accepted_option_value_is_one_directive_line(site, case):
    name, value = case
    try:
        options = job_options({name: value})
    except UserError as err:
        event("refused by its form")
        assert "\n" not in str(err) and str(err).startswith(f"{flag(name)} "), err
        return
    assert_one_directive_per_line(site, options)
