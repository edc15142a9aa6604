"""This machine, as the submission side sees it: its facts (``host``: hostname, CPUs, GPUs, the Python and MPI a
job would use), which MPI library a launcher or a Python belongs to (``flavour``), and ``doctor``, which reports
them. It imports no room above it: the launchers, the job plan and the CLI ask it."""
