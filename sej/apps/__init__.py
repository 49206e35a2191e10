"""The applications: every program sej installs, on top of the library.

    sej            sej.apps.cli        inspect and maintain journals (docs/cli.md)
    sej-hub        sej.apps.hub        the hub daemon, or one pass with --once (docs/hub.md)
    sej-hub-cron   sej.apps.hub_cron   one hub pass for cron (docs/hub.md)
    sej-retention  sej.apps.retention  delete segments every reader has passed, for cron (docs/retention.md)
    sej-archive    sej.apps.archive    archive read segments into Parquet through Spark, for cron (docs/archive.md)
    sej-pipeline   sej.apps.pipeline   the main job: producer -> hub -> Spark (README.md)

Each is a console script and runs as `python -m sej.apps.<module>` too. They share one
error shell (sej.apps.shell): errors end as one line, `PROG: error: ...`, with the same
exit codes, and `--debug` shows tracebacks. The layers point down: the applications
import the library (sej, sej.shard, sej.hub, sej.spark), and nothing in the library
imports sej.apps. Heavy dependencies load only where they are used: paramiko when an
ssh:// location is opened, PySpark and PyArrow in sej-archive and sej-pipeline.
"""
