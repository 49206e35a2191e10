"""The production rehearsal: the whole pipeline on one machine, under churn and faults (docs/rehearsal.md).

One file per part: `producer` (a producer process), `spark_job` (the streaming query and the
archive's driver), `faults` (the schedule), `observe` (acks, latencies, resources), `check`
(the invariants), `report` (the summary and plot) and `run` (the orchestration).
"""
