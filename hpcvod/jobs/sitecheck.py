"""``hpcvod sites check``: prove a site profile with one short acceptance job and judge what its ranks saw.

The job is an ordinary hpcvod job (the profile's own template, launcher line, modules and setup) whose program
is ``sitecheck_worker.py``: every rank runs ``hpcvod.runtime.sitecheck.probe`` and writes its record as JSON.
This module turns the records into checks (pass / warn / fail, each with its evidence), ``report.json``,
``report.md`` and ``report.html`` in the job folder with the plots of hpcvod/jobs/plots.py, and compares the links
with the previous report of the same site.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcvod.jobs.sitecheck_interconnect import interconnect_checks
from hpcvod.jobs.sitecheck_model import FAIL, PASS, SKIP, WARN, Check, Request
from hpcvod.jobs.sitecheck_report import (REPORT_HTML, REPORT_MD, compare, exit_status, previous_report, render_links,
                                          render_table, write_reports)
from hpcvod.jobs.scaling import (model_check, model_gradient_mib, parse_model_mib, projection, render_model_check,
                                 render_projection)
from hpcvod.schedulers import scheduler_class
from hpcvod.runtime.sitecheck import ENDED_IN_MPI, LINKS_FILE, MIB, RECORDS_DIR
from hpcvod.support.errors import UserError
from hpcvod.sites.loader import Site
from hpcvod.sites.profile import interconnect_env

if TYPE_CHECKING:  # the submission machinery loads only when a check runs
    from hpcvod.jobs.submission import Prepared

JOB_NAME = "sites-check"
DECLARED_WARN = 0.5          # inter-node bandwidth under half the profile's link_gbps is a warn
WORKER = Path(__file__).resolve().parent / "sitecheck_worker.py"
DEFAULT_PROJECTED_NODES = 64   # the projection's last row where the partition names no max_nodes
POLL_SECONDS = 2.0
KNOWN_FRAMEWORKS = ("torch", "tensorflow", "mxnet", "jax", "numpy", "cupy")



def default_request(site: Site, nodes: int | None, gpus_per_node: int | None, partition: str | None,
                    quick: bool, frameworks: tuple[str, ...], model_mib: tuple[float, ...] = (100.0,),
                    step_ms: float = 100.0) -> Request:
    """Two nodes (one where the partition has one) and two ranks a node (one per GPU where GPUs are asked for)."""
    profile = site.profile
    name = partition or profile.default_partition or next(iter(profile.partitions))
    if name not in profile.partitions:
        raise UserError(f"--partition {name!r}: site {site.name} has {', '.join(profile.partitions)}")
    part = profile.partitions[name]
    if nodes is None:
        nodes = 1 if scheduler_class(profile.scheduler).single_host or part.max_nodes == 1 else 2
    if nodes < 1:
        raise UserError(f"--nodes {nodes}: expected an integer >= 1")
    unknown = [f for f in frameworks if f not in KNOWN_FRAMEWORKS]
    if unknown:
        raise UserError(f"--framework {unknown[0]!r}: expected one of {', '.join(KNOWN_FRAMEWORKS)}")
    gpus = gpus_per_node or 0
    tasks = gpus if gpus else 2
    return Request(nodes=nodes, tasks_per_node=tasks, gpus_per_node=gpus, partition=partition, quick=quick,
                   frameworks=frameworks, model_mib=model_mib, step_ms=step_ms,
                   max_nodes=part.max_nodes or DEFAULT_PROJECTED_NODES)


def expected_env(site: Site) -> dict[str, str]:
    """The variables the profile puts into every job, which each rank should see."""
    return {**interconnect_env(site.profile.interconnect), **{k: str(v) for k, v in site.profile.env.items()}}


class _Refused(Exception):
    """Submit's MPI check refused the job before it was queued."""


class _TimedOut(Exception):
    """The job did not end within --timeout; it was cancelled."""

    def __init__(self, job_dir: Path, job_id: str, reason: str) -> None:
        super().__init__(reason)
        self.job_dir, self.job_id = job_dir, job_id


def prepare_check(site: Site, request: Request) -> "Prepared":
    """The acceptance job, rendered but not submitted (a ``Prepared``): an ordinary job whose program is the
    check's worker, so it gets the profile's template, launcher line, modules and setup as a user's job does."""
    from hpcvod.jobs.spec import JobSpec
    from hpcvod.jobs.submission import prepare
    from hpcvod.machine.host import detect_host

    payload = {"env_expect": expected_env(site), "frameworks": list(request.frameworks),
               "max_bytes": (4 if request.quick else 256) * MIB, "gpus_per_node": request.gpus_per_node}
    spec = JobSpec(program=str(WORKER), args=(json.dumps(payload),), nodes=request.nodes,
                   tasks_per_node=request.tasks_per_node, gpus_per_node=request.gpus_per_node or None,
                   partition=request.partition, time="00:15:00", job_name=JOB_NAME)
    return prepare(spec, site, detect_host(), command=("sites", "check", site.name))


EMPTY_LOG = "(empty)"
SAID_BY = "init_error_said_by"   # who told a rank's init_error: "python" (hvd.init() raised) or "mpi_log"


def read_records(job_dir: Path, world_size: int, output: Path) -> tuple[list[dict | None], str]:
    """Each rank's record (None where a rank wrote none, or failed) and the end of the job's output, the first
    failing rank's last error line first."""
    records: list[dict | None] = []
    for rank in range(world_size):
        path = job_dir / RECORDS_DIR / f"{rank}.json"
        record = json.loads(path.read_text()) if path.exists() else None
        if record and record.pop(ENDED_IN_MPI, False):
            log = job_dir / RECORDS_DIR / f"{rank}.mpi.log"
            said = [line.strip() for line in (log.read_text(errors="replace") if log.exists() else "").splitlines()
                    if line.strip()][-2:]
            record["init_error"] = (f"rank {rank} on {record.get('hostname')} ended inside the MPI without a Python "
                                    f"error; {log.name} ends: " + (" / ".join(said) or EMPTY_LOG))
            record[SAID_BY] = "mpi_log" if said else EMPTY_LOG
        records.append(record)
    tail = "\n".join((output.read_text(errors="replace") if output.exists() else "").splitlines()[-15:])
    failures = [r["error"].strip().splitlines()[-1] for r in records if r and "error" in r]
    if failures:
        tail = failures[0] + "\n" + tail
    return [None if r is None or "error" in r else r for r in records], tail


def _run_job(site: Site, request: Request, folder: Path) -> tuple[Path, str, list[dict | None], str, str]:
    """Submit the acceptance job and wait: (job folder, job id, each rank's record or None, final state, output
    tail)."""
    import io

    from hpcvod.jobs.submission import cancel_job, job_mpi_check, job_status, submit_prepared
    from hpcvod.schedulers.base import TERMINAL
    from hpcvod.jobs.watch import wait_for

    prepared = prepare_check(site, request)
    problem, _ = job_mpi_check(prepared.plan)   # submit's own check: this Python would start N one-rank worlds
    if problem:
        raise _Refused(problem)
    ref = submit_prepared(prepared, folder)
    assert ref.job_dir is not None
    if request.timeout is None:
        wait_for(ref, stream=io.StringIO())
    else:
        deadline = time.monotonic() + request.timeout
        while job_status(ref).state not in TERMINAL and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
        if job_status(ref).state not in TERMINAL:
            state = job_status(ref).state
            cancel_job(ref)
            raise _TimedOut(ref.job_dir, ref.job_id, f"the job did not end within --timeout {request.timeout:g} s "
                            f"(it was {state}); cancelled")
    state = job_status(ref).state
    records, tail = read_records(ref.job_dir, request.world_size, ref.output)
    return ref.job_dir, ref.job_id, records, state, tail


def _world_checks(site: Site, request: Request, records: list[dict | None]) -> list[Check]:
    got = [r for r in records if r is not None]
    # once one rank fails, the launcher ends the others wherever they are (srun: "Terminating StepId"): a rank
    # that ended inside the MPI may only have been killed. The evidence is a rank's own Python error first, then
    # a rank whose MPI log said something, last a rank that left only an early record.
    said_first = {"python": 0, "mpi_log": 1, EMPTY_LOG: 2}
    init_errors = [r["init_error"] for r in sorted((r for r in got if "init_error" in r),
                                                   key=lambda r: said_first[r.get(SAID_BY, "python")])]
    checks = []
    sizes = sorted({r.get("size") for r in got if "size" in r})
    want = request.world_size
    flavour_said = next((e for e in init_errors if "mpi4py loaded" in e), None)
    if init_errors and not flavour_said:
        checks.append(Check("world.size", FAIL, f"hvd.init() failed: {init_errors[0]}"[:600]))
    elif flavour_said:
        checks.append(Check("world.size", FAIL, "no world formed: hvd.init() refused the MPI (see world.mpi_flavour)"))
    elif len(got) < want:
        checks.append(Check("world.size", FAIL, f"{len(got)} of {want} ranks reported back"))
    elif sizes == [want]:
        checks.append(Check("world.size", PASS, f"one world of {want} ranks ({request.nodes} node(s) x "
                                                f"{request.tasks_per_node})"))
    elif sizes == [1] and want > 1:
        checks.append(Check("world.size", FAIL, f"{len(got)} one-rank worlds instead of one world of {want}: the "
                            f"launcher did not connect the ranks (launcher.mpi_plugin "
                            f"{site.profile.launcher.mpi_plugin!r} with mpi.flavour {site.profile.mpi.flavour!r}?)"))
    else:
        checks.append(Check("world.size", FAIL, f"world sizes {sizes}, expected {want}"))
    ok = [r for r in got if r.get("size") == want]
    if len(ok) == want:
        wrong = [f"rank {r['rank']}: local {r['local_rank']}/{r['local_size']}, cross {r['cross_rank']}/"
                 f"{r['cross_size']}" for r in ok
                 if r["local_size"] != request.tasks_per_node or r["cross_size"] != request.nodes
                 or r["rank"] != r["cross_rank"] * request.tasks_per_node + r["local_rank"]
                 or r["rank"] != r["launcher_rank"]]
        checks.append(Check("world.layout", FAIL if wrong else PASS,
                            "; ".join(wrong[:4]) if wrong else f"local_size {request.tasks_per_node}, cross_size "
                            f"{request.nodes}, rank = cross_rank x {request.tasks_per_node} + local_rank"))
        hosts = ok[0]["hosts"]
        distinct = sorted(set(hosts))
        checks.append(Check("world.nodes", PASS if len(distinct) == request.nodes else FAIL,
                             f"{len(distinct)} node(s): {', '.join(distinct)}"))
        levels = sorted({r["thread_level"] for r in ok})
        status = PASS if levels == ["multiple"] else WARN if levels == ["serialized"] else FAIL
        checks.append(Check("world.thread_level", status, f"MPI_THREAD_{'/'.join(levels).upper()}"
                            + ("" if status == PASS else " (the runtime's engine needs SERIALIZED; MULTIPLE is "
                                                       "needed for concurrent frameworks)")))
    promised = site.profile.mpi.flavour
    loaded = sorted({r["mpi_flavour"] for r in got if "mpi_flavour" in r})
    if flavour_said:
        checks.append(Check("world.mpi_flavour", FAIL, flavour_said[:600]))
    elif loaded:
        said = sorted({r["launcher_env"].get("HPCVOD_MPI_FLAVOUR", "") for r in got} - {""})
        want_flavour = said[0] if promised == "auto" and said else promised
        match = loaded == [want_flavour] or (want_flavour == "mpich" and loaded == ["mvapich"])
        library = next(r["mpi_library"] for r in got if "mpi_library" in r)
        checks.append(Check("world.mpi_flavour", PASS if match else FAIL,
                            f"profile {promised}{f' ({want_flavour})' if promised == 'auto' else ''}, ranks loaded "
                            f"{', '.join(loaded)}: {library[:100]}"))
    return checks


def _environment_checks(site: Site, request: Request, records: list[dict | None], state: str,
                        tail: str) -> list[Check]:
    got = [r for r in records if r is not None]
    checks = []
    setup = [*(f"module load {m}" for m in site.profile.modules), *site.profile.setup]
    if not got:
        checks.append(Check("env.setup", FAIL, f"no rank started (job {state}); the script runs under set -e, so "
                            f"a failing module/setup line or launcher stops it; last output:\n{tail}"))
        return checks
    checks.append(Check("env.setup", PASS, f"{len(setup)} module/setup line(s) ran before the ranks started"
                        + (f": {'; '.join(setup)[:200]}" if setup else "")))
    expected = expected_env(site)
    wrong = sorted({f"{k}={r['env'].get(k)!r} (expected {v!r})" for r in got for k, v in expected.items()
                    if r["env"].get(k) != v})
    checks.append(Check("env.profile_env", FAIL if wrong else PASS,
                        "; ".join(wrong[:4]) if wrong else f"{len(expected)} variable(s) of the profile on every rank"
                        + (f": {', '.join(expected)}" if expected else "")))
    pythons = sorted({r["python"] for r in got})
    checks.append(Check("env.python", PASS if len(pythons) == 1 else WARN,
                        f"hpcvod {got[0]['hpcvod']['file']} under {', '.join(pythons)} "
                        f"(Python {got[0]['python_version']})"))
    checks.append(_container_check(site, got))
    for name in request.frameworks:
        missing = [f"{r['hostname']}: {r['frameworks'][name].get('error')}" for r in got
                   if r["frameworks"][name]["ok"] != "yes"]
        checks.append(Check(f"env.framework.{name}", FAIL if missing else PASS,
                            missing[0] if missing else f"{name} {got[0]['frameworks'][name]['version']} on every rank"))
    return checks


# what each wrapping runtime sets inside (podman: container=podman; ch-run: CH_RUNNING)
CONTAINER_MARKERS = {"apptainer": ("APPTAINER_CONTAINER", "SINGULARITY_CONTAINER"),
                     "singularity": ("APPTAINER_CONTAINER", "SINGULARITY_CONTAINER"),
                     "charliecloud": ("CH_RUNNING",), "podman": ("container",)}


def _container_check(site: Site, got: list[dict]) -> Check:
    """The ranks run inside the profile's container: apptainer/singularity set APPTAINER_CONTAINER or
    SINGULARITY_CONTAINER inside, ch-run CH_RUNNING, podman `container`; pyxis/enroot leave no marker this check
    knows (a warn with the OS seen)."""
    image, runtime = site.profile.container.image, site.profile.container.runtime
    if not image:
        return Check("env.container", SKIP, "the profile names no container image (container.image)")
    seen = sorted({r.get("container", {}).get("os", "?") for r in got})
    if runtime == "pyxis":
        return Check("env.container", WARN, f"{len(got)} rank(s) started through pyxis with {image!r}; they see "
                     f"{', '.join(seen)} (pyxis/enroot leave no marker this check can read)")
    markers = CONTAINER_MARKERS.get(runtime or "", ())
    outside = [f"{r['hostname']} rank {r.get('launcher_rank')}" for r in got
               if not any(r.get("container", {}).get(k) for k in markers)]
    if outside:
        return Check("env.container", FAIL, f"{len(outside)} rank(s) outside any {runtime} container: "
                     f"{', '.join(outside[:4])} (no {'/'.join(markers)})")
    images = sorted({r["container"].get("APPTAINER_CONTAINER") or r["container"].get("SINGULARITY_CONTAINER")
                     or image for r in got})
    return Check("env.container", PASS, f"every rank inside {', '.join(images)} ({', '.join(seen)})")


def _peak(points: list[dict], key: str) -> float:
    return max((p[key] for p in points), default=0.0)


def link_figures(links: dict[str, Any]) -> dict[str, float]:
    """The few numbers a report compares: latency (us) and peak bandwidth (Gbit/s) per path."""
    out = {}
    for path in ("intra_node", "inter_node"):
        if links.get(path):
            out[f"{path}.latency_us"] = links[path]["latency_us"]
            out[f"{path}.gbps"] = _peak(links[path]["points"], "gbps")
    for path in ("allreduce", "allreduce_device"):
        if links.get(path):
            out[f"{path}.bus_gbps"] = _peak(links[path], "bus_gbps")
    return out


def _link_checks(site: Site, links: dict[str, Any] | None, previous: dict[str, Any] | None) -> list[Check]:
    if not links:
        return [Check("links", SKIP, "not measured: the world has one rank (or never formed)")]
    figures = link_figures(links)
    declared = site.profile.interconnect.link_gbps
    checks = []
    for path in ("intra_node", "inter_node"):
        if f"{path}.gbps" not in figures:
            checks.append(Check(f"links.{path}", SKIP, "the job has no such pair of ranks (one node, or one rank a "
                                                       "node)"))
            continue
        status, text = PASS, (f"latency {figures[f'{path}.latency_us']:.1f} us, peak {figures[f'{path}.gbps']:.2f} "
                              f"Gbit/s (host buffers, rank 0 <-> {links[path]['peer']})")
        if path == "inter_node" and declared:
            share = figures[f"{path}.gbps"] / declared
            text += f", {share:.0%} of the declared {declared:g} Gbit/s"
            if share < DECLARED_WARN:
                status = WARN
        checks.append(Check(f"links.{path}", status, text))
    checks.append(Check("links.allreduce", PASS, f"peak bus bandwidth {figures['allreduce.bus_gbps']:.2f} Gbit/s over "
                        f"{links['world_size']} ranks, {links['allreduce'][0]['bytes'] // 1024} KiB to "
                        f"{links['allreduce'][-1]['bytes'] // 1024} KiB"))
    if links.get("allreduce_device"):
        checks.append(Check("links.allreduce_device", PASS, f"peak bus bandwidth "
                            f"{figures['allreduce_device.bus_gbps']:.2f} Gbit/s over {links['world_size']} ranks, "
                            f"device buffers (interconnect.nccl says whether NCCL carried them)"))
    checks.extend(compare(figures, previous))
    return checks



def _refused_report(site: Site, request: Request, check: Check) -> dict[str, Any]:
    """The report of a check that ended before any rank ran."""
    checks = [check]
    return {"site": site.name, "source": str(site.source), "job_dir": None, "job_id": None, "state": "NOT SUBMITTED",
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "request": dataclasses.asdict(request),
            "checks": [dataclasses.asdict(c) for c in checks], "figures": {}, "links": None,
            "exit_status": exit_status(checks)}


def run_check(site: Site, request: Request, root: Path) -> dict[str, Any]:
    """Submit, wait, judge; write the reports and plots into the job folder (``write_reports``); return the
    report."""
    try:
        job_dir, job_id, records, state, tail = _run_job(site, request, root)
    except _Refused as err:  # the job's Python loads another MPI: this check's finding, not a usage error
        return _refused_report(site, request, Check("world.mpi_flavour", FAIL, f"refused before submitting: {err}"))
    except _TimedOut as err:
        report = _refused_report(site, request, Check("job.time", FAIL, str(err)))
        report.update(job_dir=str(err.job_dir), job_id=err.job_id, state="CANCELLED")
        write_reports(err.job_dir, report)
        return report
    return judge(site, request, root, job_dir, job_id, records, state, tail)


def judge(site: Site, request: Request, root: Path, job_dir: Path, job_id: str, records: list[dict | None],
          state: str, tail: str) -> dict[str, Any]:
    """The checks from the ranks' records, the projection and the plots; the reports written into the
    job folder (whatever ran the job: a scheduler, or a test running its script body as PBS would)."""
    links = next((r.get("links") for r in records if r and r.get("links")), None)
    if links is None and (job_dir / LINKS_FILE).exists():
        links = json.loads((job_dir / LINKS_FILE).read_text())
    previous = previous_report(root, site.name, job_dir)
    checks = (_world_checks(site, request, records) + _environment_checks(site, request, records, state, tail)
              + interconnect_checks(site, request, records) + _link_checks(site, links, previous))
    figures = link_figures(links) if links else {}
    report: dict[str, Any] = {
        "site": site.name, "source": str(site.source), "job_dir": str(job_dir), "job_id": job_id,
        "state": state, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "request": dataclasses.asdict(request), "checks": [dataclasses.asdict(c) for c in checks],
        "figures": figures, "links": links, "exit_status": exit_status(checks),
        "projection": projection(figures, list(request.model_mib), request.tasks_per_node,
                                 request.max_nodes, request.step_ms, request.overlap) if links else [],
        "model_check": model_check(figures, links.get("allreduce") or [], request.nodes,
                                   request.tasks_per_node) if links else None}
    write_reports(job_dir, report)
    return report


def check_command(args: Any) -> int:
    """`hpcvod sites check`: the report printed (or --json), exit 0 all pass, 1 any fail."""
    import sys

    from hpcvod.jobs.jobdir import default_roots
    from hpcvod.machine.host import detect_host
    from hpcvod.schedulers import profile_options
    from hpcvod.sites.loader import discover_site

    site = discover_site(args.site, detect_host().hostname, schedulers=profile_options())
    if not args.step_ms > 0:
        raise UserError(f"--step-ms {args.step_ms:g}: expected a time in milliseconds > 0")
    if args.timeout is not None and not args.timeout > 0:
        raise UserError(f"--timeout {args.timeout:g}: expected seconds > 0")
    if not 0 <= args.overlap < 1:
        raise UserError(f"--overlap {args.overlap:g}: expected a fraction from 0 to below 1")
    sizes = parse_model_mib(args.model_mib) if args.model_mib is not None else ()
    if args.model:
        mib, parameters = model_gradient_mib(args.model)
        sizes += (round(mib, 3),)
        if not args.json:
            print(f"--model {args.model}: {parameters:,} floating-point parameters, {mib:.1f} MiB of gradients",
                  file=sys.stderr)
    request = default_request(site, args.nodes, args.gpus_per_node, args.partition, args.quick,
                              tuple(dict.fromkeys(args.framework)), sizes or (100.0,), args.step_ms)
    request = dataclasses.replace(request, timeout=args.timeout, overlap=args.overlap, model=args.model)
    root = Path(args.output_dir) if args.output_dir else default_roots()[0]
    if not args.json:
        print(f"sites check {site.name}: one job of {request.nodes} node(s) x {request.tasks_per_node} rank(s) "
              f"through {site.source} ...", file=sys.stderr, flush=True)
    report = run_check(site, request, root)
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(render_table([Check(**c) for c in report["checks"]]))
        links = render_links(report.get("links"))
        if links:
            print("\n" + links)
        if report.get("projection"):
            print("\n" + render_projection(report["projection"], request.step_ms, request.overlap))
        if report.get("model_check"):
            print("\n" + render_model_check(report["model_check"]))
        if report.get("plots_note"):
            print(f"\nno plots: {report['plots_note']}")
        where = (f"report in {Path(report['job_dir']) / REPORT_MD} and {REPORT_HTML} beside it"
                 + (f" (plots: {', '.join(report['plots'])})" if report.get("plots") else "")
                 if report["job_dir"] else "no job submitted")
        print(f"\n{'FAIL' if report['exit_status'] else 'PASS'}: {where}")
    return int(report["exit_status"])
