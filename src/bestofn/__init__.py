"""bestofn: best-of-N voice-acting data, one group (emotion x prompt) at a time.

The packages in their layers, top to bottom; a module imports only from layers below its own
(import-linter contracts in pyproject.toml, checked by ``make lint``; docs/ARCHITECTURE.md):

cli             the ``bestofn`` command
commands        ops/ (``bestofn plan``, doctor, status, verify, ab, pcm_diff), serve/ (the
                speech endpoint), export/ (training data), parity/ (moss-fast against the
                published code)
workflow_glue   what the Snakefile and its scripts call
fakes/          random weights in the published layouts (``bestofn fake-weights``)
worker/         the fused per-GPU worker; worker/client/: the group job's side, the SLURM feeder
core/           plan (config + sheets -> groups, every check before a model loads), voice-acting
                conditioning, pipeline stages, the stage scheduler (runner), group I/O (one
                group = one directory, complete or absent), single renders
report/         pages over the database: throughput, trust, listening, votes
select/         the database rules: selection, held-out scorers, trust tables
weights/        manifest, fetch, lock, identity by content
backends/       one adapter per model family, chosen by name in the config
moss/           our MOSS-TTS inference: engines, codec/, kernels
leaves          util/ (audio, hashing, spec, dtypes, ...), schemas/ (the config and sheet
                schemas, where every default is written), snakemake_speedups

The lab (benchmarks, probes, fault injection) is lab/ at the repository root, outside the
package.
"""

__version__ = "0.1.0"
