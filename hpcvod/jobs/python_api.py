"""Python API: run a callable on every rank of a job, on any site, and get rank 0's result back.

    import hpcvod.jobs

    def train(lr):
        import hpcvod.torch as hvd
        hvd.init()
        ...
        return {"rank": hvd.rank(), "accuracy": acc}

    job = hpcvod.jobs.submit(train, 0.1, site="slurm-ib-openmpi", nodes=2, gpus_per_node=4)
    print(job.job_id, job.state)
    print(job.result())           # rank 0's return value (raises the first rank's exception, if any)

    result = hpcvod.jobs.run(train, 0.1, site="local", tasks_per_node=2)    # submit + result

Built on submitit: ``HpcvodExecutor`` is a submitit ``PicklingExecutor`` (``executor.submit``, ``map_array``
style batches, ``update_parameters`` with errors that list the valid names), ``HpcvodJob`` a submitit ``Job``
(``result``, ``results``, ``done``, ``state``, ``cancel``, ``stdout``). Pickling uses submitit's
cloudpickle-based ``DelayedSubmission``; the job itself is an ordinary hpcvod job: a site profile, a rendered
script and a job folder holding the pickles next to the script and the logs.
"""

from __future__ import annotations

import difflib
import io
import os
import time
import typing as tp
from pathlib import Path

from submitit.core import core, utils

from hpcvod.jobs.jobdir import REQUEST_FILE, JobRef, ensure_root
from hpcvod.jobs.spec import DATA_SERVICE_OPTIONS, JobSpec, data_service_spec
from hpcvod.jobs.submission import (cancel_job, job_status, job_world_size, prepare, refuse_another_mpi,
                                    submit_prepared)
from hpcvod.jobs.watch import wait_for
from hpcvod.machine.host import detect_host
from hpcvod.schedulers import profile_options
from hpcvod.schedulers.base import COMPLETED, OUTPUT_FILE, TERMINAL
from hpcvod.schedulers.jobfiles import job_modes, open_job_file
from hpcvod.support.errors import UserError
from hpcvod.sites.joboptions import job_options, option_names
from hpcvod.sites.loader import Site, discover_site

WORKER = Path(__file__).resolve().parent / "submitit_worker.py"
# the job options (exclusive, mem, qos, dependency...) by their field names in hpcvod/sites/joboptions.py
PARAMETERS = ("nodes", "min_nodes", "gpus_per_node", "tasks_per_node", "cpus_per_task", "time", "partition", "account",
              "job_name", "env", "container", "secret_env", "shared_job_dir", *option_names(), "data_service_nodes",
              *DATA_SERVICE_OPTIONS)
RESULT_GRACE_SECONDS = 15  # a shared file system may show the result pickle a little after the job ended


class HpcvodJob(core.Job):
    """A submitted hpcvod job seen through submitit's Job interface; its task 0 is rank 0."""

    def __init__(self, folder: Path | str, job_id: str, tasks: tp.Sequence[int] = (0,),
                 ref: JobRef | None = None) -> None:
        if ref is None:
            raise ValueError("HpcvodJob needs the hpcvod job it stands for (ref=JobRef)")
        self.ref = ref
        super().__init__(folder=folder, job_id=job_id, tasks=(0,))

    def _register_in_watcher(self) -> None:
        """hpcvod asks the site's scheduler itself (squeue/scontrol/sacct, qstat, the local pid)."""

    @property
    def job_dir(self) -> Path:
        assert self.ref.job_dir is not None
        return self.ref.job_dir

    @property
    def world_size(self) -> int:
        size = job_world_size(self.ref)
        if size is None:
            raise UserError(f"{self.job_dir / REQUEST_FILE}: plan.world_size: expected the job's number of ranks")
        return size

    @property
    def state(self) -> str:
        return job_status(self.ref).state

    def done(self, force_check: bool = False) -> bool:  # noqa: ARG002 - submitit's signature
        return job_status(self.ref).state in TERMINAL

    def wait(self) -> None:
        wait_for(self.ref, stream=io.StringIO())

    def cancel(self, check: bool = True) -> None:  # noqa: ARG002 - submitit's signature
        cancel_job(self.ref)

    def _outcome(self, rank: int) -> tuple[str, tp.Any] | None:
        path = utils.JobPaths(self.job_dir, job_id=self.job_id, task_id=rank).result_pickle
        return utils.pickle_load(path) if path.exists() else None

    def results(self) -> list[tp.Any]:
        """Every rank's return value, rank order; raises the lowest rank's exception if one raised."""
        self.wait()
        status = job_status(self.ref)
        outcomes = [self._outcome(rank) for rank in range(self.world_size)]
        deadline = time.monotonic() + (RESULT_GRACE_SECONDS if status.state == COMPLETED else 0)
        while any(o is None for o in outcomes) and time.monotonic() < deadline:
            time.sleep(0.5)
            outcomes = [o or self._outcome(rank) for rank, o in enumerate(outcomes)]
        for rank, outcome in enumerate(outcomes):
            if outcome is not None and outcome[0] == "error":
                raise utils.FailedJobError(
                    f"job {self.job_id} (rank {rank}) failed with:\n{'-' * 40}\n{outcome[1]}{'-' * 40}\n"
                    f"full output: {self.job_dir / OUTPUT_FILE}")
        missing = [rank for rank, o in enumerate(outcomes) if o is None]
        if missing:
            tail = "\n".join((self.stdout() or "").splitlines()[-30:])
            raise utils.UncompletedJobError(
                f"job {self.job_id} ended {status.state} (exit {status.exit_code}) without a result from rank(s) "
                f"{', '.join(map(str, missing))}; last lines of {self.job_dir / OUTPUT_FILE}:\n{tail}")
        return [o[1] for o in outcomes]  # type: ignore[index]

    def result(self) -> tp.Any:
        """Rank 0's return value."""
        return self.results()[0]

    def exception(self) -> utils.UncompletedJobError | utils.FailedJobError | None:
        try:
            self.results()
        except (utils.UncompletedJobError, utils.FailedJobError) as err:
            return err
        return None

    def stdout(self) -> str | None:
        try:
            with open_job_file(self.job_dir / OUTPUT_FILE, "job output") as f:
                return f.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return None

    def stderr(self) -> str | None:
        return None  # stderr is merged into output.log (see stdout())

    def __repr__(self) -> str:
        return f"HpcvodJob<id={self.job_id}, site={self.ref.site}, folder={self.job_dir}>"


class HpcvodExecutor(core.PicklingExecutor):
    """A submitit executor whose jobs are hpcvod jobs: site profiles, rendered scripts, every rank runs the call.

    ``folder`` is where job folders are created (default ./hpcvod-jobs); ``site`` a profile name or path (default:
    hpcvod's discovery: $HPCVOD_SITE, hostname patterns, local); the other keywords are the resources of
    ``hpcvod submit``: nodes, gpus_per_node, tasks_per_node, cpus_per_task, time, partition, account, job_name,
    env (a mapping, written into the script), container, secret_env (names whose values the job takes from this
    process's environment at submit time; only the names are written), shared_job_dir (True: the job folder
    is readable by the group; default: the site's jobs.shared_with_group, else owner only), and the scheduler
    options of ``hpcvod submit`` by their names: exclusive, mem, mem_per_gpu, constraint, qos, reservation,
    nodelist, exclude, begin, mail_type, mail_user, dependency, sched_opt (a list) (docs/submission.md), and a
    tf.data service compute job beside the call's ranks: data_service_nodes, data_service_partition,
    data_service_tasks_per_node, data_service_dispatchers, data_service_dispatcher_side (docs/data-service.md; the
    call finds the config in $HPCVOD_DATA_SERVICE_CONFIG), and min_nodes (an elastic job: it survives a failed
    node and the call, under ``hvd.elastic.run``, trains on while that many nodes are left; docs/elastic.md).
    ``array`` is refused: one call is one job here
    (``executor.batch()`` submits several).
    """

    job_class = HpcvodJob

    def __init__(self, folder: Path | str = "hpcvod-jobs", site: str | Site | None = None,
                 **parameters: tp.Any) -> None:
        super().__init__(folder, max_num_timeout=0)
        self.host = detect_host()
        if not isinstance(site, Site):
            site = discover_site(site, self.host.hostname, schedulers=profile_options())
        self.site = site
        self._default_job_name: str | None = None
        self.update_parameters(**parameters)

    @classmethod
    def name(cls) -> str:
        return "hpcvod"

    def _internal_update_parameters(self, **kwargs: tp.Any) -> None:
        unknown = [k for k in kwargs if k not in PARAMETERS]
        if unknown:
            hints = [difflib.get_close_matches(k, PARAMETERS, n=1) for k in unknown]
            said = ", ".join(f"{k!r}" + (f" (did you mean {h[0]!r}?)" if h else "") for k, h in zip(unknown, hints))
            raise ValueError(f"unknown parameter(s) {said}; valid: {', '.join(PARAMETERS)}")
        self.parameters.update(kwargs)

    def _spec(self) -> JobSpec:
        params = dict(self.parameters)
        env = params.pop("env", None) or {}
        if not isinstance(env, dict):
            raise UserError(f"env: expected a mapping of names to values, got {type(env).__name__}")
        if not params.get("job_name") and self._default_job_name:
            params["job_name"] = self._default_job_name
        secret_env = params.pop("secret_env", None) or ()
        if isinstance(secret_env, str) or not all(isinstance(k, str) for k in secret_env):
            raise UserError(f"secret_env: expected a list of variable names, got {secret_env!r}")
        if params.get("array") is not None:
            raise UserError("array: the Python API runs one call per job and keeps one result; submit several "
                            "calls with executor.batch(), or a script with `hpcvod submit --array`")
        options = job_options({name: params.pop(name, None) for name in option_names()})
        data_service = data_service_spec({name: params.pop(name, None)
                                          for name in ("data_service_nodes", *DATA_SERVICE_OPTIONS)})
        return JobSpec(program=str(WORKER), env=tuple((str(k), str(v)) for k, v in env.items()),
                       secret_env=tuple(secret_env), options=options, data_service=data_service, **params)

    def _prepared(self):
        return prepare(self._spec(), self.site, self.host, command=("hpcvod.jobs.python_api", self.site.name))

    def _internal_process_submissions(self, delayed_submissions: list[utils.DelayedSubmission]) -> list[core.Job]:
        # name jobs after the function, as `hpcvod submit` names them after the script
        function = delayed_submissions[0].function if delayed_submissions else None
        self._default_job_name = getattr(function, "__name__", None) if function is not None else None
        if self._default_job_name == "<lambda>":
            self._default_job_name = "lambda"
        # submitit pickles the call into the jobs root, then moves it into the job folder: the root is made as
        # `hpcvod submit` makes it, and the pickle (the function and its arguments) gets the job folder's modes
        shared = self.parameters.get("shared_job_dir")
        modes = job_modes(self.site.profile.jobs.shared_with_group if shared is None else bool(shared))
        ensure_root(Path(self.folder), modes.shared)
        old_umask = os.umask(modes.umask)  # process-wide for this moment: only ever narrower than the user's
        try:
            return super()._internal_process_submissions(delayed_submissions)
        finally:
            os.umask(old_umask)

    def _num_tasks(self) -> int:
        return self._prepared().plan.world_size

    def _submit_command(self, command: str) -> core.Job:  # noqa: ARG002 - submitit's signature
        prepared = self._prepared()
        refuse_another_mpi(prepared.plan)
        ref = submit_prepared(prepared, Path(self.folder))
        assert ref.job_dir is not None
        # the pickles live in the job folder, next to the script and output.log
        return HpcvodJob(folder=ref.job_dir, job_id=ref.job_id, ref=ref)

    def _make_submission_file_text(self, command: str, uid: str) -> str:  # noqa: ARG002
        return self._prepared().script

    def _make_submission_command(self, submission_file_path: Path) -> list[str]:
        raise NotImplementedError("hpcvod submits through its scheduler modules (see _submit_command)")

    @staticmethod
    def _get_job_id_from_submission_command(string: bytes | str) -> str:
        raise NotImplementedError("hpcvod submits through its scheduler modules (see _submit_command)")


def submit(fn: tp.Callable[..., tp.Any], *args: tp.Any, site: str | Site | None = None,
           folder: str | Path = "hpcvod-jobs", kwargs: dict[str, tp.Any] | None = None,
           **parameters: tp.Any) -> HpcvodJob:
    """Submit ``fn(*args, **kwargs)`` to run on every rank; ``job.result()`` is rank 0's return value.
    ``parameters`` are hpcvod submit's resources (nodes=, gpus_per_node=, tasks_per_node=, time=, ...)."""
    executor = HpcvodExecutor(folder=folder, site=site, **parameters)
    return tp.cast(HpcvodJob, executor.submit(fn, *args, **(kwargs or {})))


def run(fn: tp.Callable[..., tp.Any], *args: tp.Any, site: str | Site | None = None,
        folder: str | Path = "hpcvod-jobs", kwargs: dict[str, tp.Any] | None = None,
        **parameters: tp.Any) -> tp.Any:
    """``submit(...)`` and wait: rank 0's return value (or the first failing rank's exception)."""
    return submit(fn, *args, site=site, folder=folder, kwargs=kwargs, **parameters).result()


__all__ = ["HpcvodExecutor", "HpcvodJob", "run", "submit"]
