"""The group job's side of the worker: start or reuse a slot's worker and send
it a group, and the SLURM feeder that runs a bundle of groups in one job."""
