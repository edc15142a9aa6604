"""``hpcvod sites list|show NAME|validate FILE...|schema|check [SITE]``: site profiles."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

from hpcvod.cli.command import Command
from hpcvod.cli.options import EXIT_OK, EXIT_USAGE, Parser, print_json
from hpcvod.support.errors import UserError, one_line


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("sites", help="site profiles: list, show, validate, schema")
    sites = p.add_subparsers(dest="sites_command", metavar="ACTION", parser_class=Parser)
    sites.required = True
    sites.add_parser("list", help="profiles that --site can name, and where they are")
    q = sites.add_parser("show", help="a profile after extends and defaults")
    q.add_argument("name", metavar="NAME", help="profile name or path")
    q = sites.add_parser("validate", help="check profile files; exit 2 if any is invalid")
    q.add_argument("files", metavar="FILE", nargs="+")
    q = sites.add_parser("schema", help="the JSON Schema of a profile (for editors)")
    q.add_argument("--markdown", action="store_true", help="the key reference table of docs/sites.md instead")
    q = sites.add_parser("check", help="run one acceptance job through a profile: world, environment, links "
                         "(exit 0 all pass, 1 any fail)")
    q.add_argument("site", metavar="SITE", nargs="?", help="profile name or path (default: as --site finds one)")
    q.add_argument("--nodes", type=int, help="nodes (default 2; 1 on local or a one-node partition)")
    q.add_argument("--gpus-per-node", type=int, help="GPUs a node, one rank each (default: 2 CPU ranks a node)")
    q.add_argument("--partition", help="partition or queue (default: the profile's)")
    q.add_argument("--quick", action="store_true", help="measure messages up to 4 MiB instead of 256 MiB")
    q.add_argument("--framework", action="append", default=[], metavar="NAME",
                   help="a framework the ranks must import (repeatable): torch, tensorflow, mxnet, ...")
    q.add_argument("--output-dir", metavar="DIR", help="where the job folder goes (default: $HPCVOD_JOBS_DIR's "
                   "first entry, then ./hpcvod-jobs); earlier reports there are compared")
    q.add_argument("--json", action="store_true", help="print the report as JSON")
    q.add_argument("--model-mib", metavar="MIB[,MIB...]",
                   help="gradient sizes for the projected allreduce time and scaling (default 100 without --model)")
    q.add_argument("--model", metavar="PATH", help="a saved torch state_dict, checkpoint or TorchScript file whose "
                   "parameters give one more gradient size (needs torch in this Python)")
    q.add_argument("--overlap", type=float, default=0.0, metavar="FRACTION",
                   help="share of the allreduce hidden behind the backward pass in the projected efficiency "
                   "(default 0: none, a lower bound)")
    q.add_argument("--step-ms", type=float, default=100.0, metavar="MS",
                   help="compute time of one training step for the projected efficiency (default 100)")
    q.add_argument("--timeout", type=float, metavar="SECONDS",
                   help="cancel the job and fail if it has not ended this long after submission (default: wait)")
    return p


def run(args: argparse.Namespace, program: list[str], argv: Sequence[str]) -> int:
    from hpcvod import sites
    from hpcvod.schedulers import profile_options

    schedulers = profile_options()
    if args.sites_command == "schema":
        if args.markdown:
            sys.stdout.write(sites.reference_markdown(schedulers))
        else:
            print_json(sites.schema(schedulers))
        return EXIT_OK
    if args.sites_command == "list":
        rows = []
        for name, path in sites.site_files().items():
            try:
                site = sites.load_site_file(path, schedulers=schedulers)
                rows.append((name, site.profile.scheduler, str(path), site.profile.description))
            except UserError as err:
                rows.append((name, "INVALID", str(path), str(err)))
        width = max(len(r[0]) for r in rows)
        for name, scheduler, path, text in rows:
            print(f"{name:<{width}}  {scheduler:<7}  {text}  [{path}]")
        return EXIT_OK
    if args.sites_command == "show":
        import yaml

        from hpcvod.sites.spec import to_data

        site = sites.load_site(args.name, schedulers=schedulers)
        print(f"# site {site.name} from {site.source} (after extends and defaults)")
        data = to_data(site.profile)
        data["scheduler_options"] = to_data(site.scheduler_options)
        sys.stdout.write(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))
        return EXIT_OK
    if args.sites_command == "check":
        from hpcvod.jobs.sitecheck import check_command

        return check_command(args)
    # validate: every problem of every file, one line each (file:line: key: what, expected)
    bad = 0
    for name in args.files:
        try:
            path = sites.site_path(name, "validate")
        except UserError as err:
            print(one_line(str(err)), file=sys.stderr)
            bad += 1
            continue
        if path.name.startswith("_"):
            problems = sites.check_base_file(path, schedulers=schedulers)
            verdict = "ok (a base for extends: checked key by key, required keys not enforced)"
        else:
            site, problems = sites.validate_site_file(path, schedulers=schedulers)
            verdict = f"ok (site {site.name}, scheduler {site.profile.scheduler})" if site else ""
        for problem in problems:
            print(one_line(str(problem)), file=sys.stderr)
        if problems:
            bad += 1
        else:
            print(one_line(f"{name}: {verdict}"))
    return EXIT_USAGE if bad else EXIT_OK


COMMAND = Command("sites", add_parser, run)
