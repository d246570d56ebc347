"""bestofn: best-of-N voice-acting data, one group (emotion x prompt) at a time.

The package in its layers, top to bottom; a module imports only from layers below its own
(import-linter contracts in pyproject.toml, checked by ``make lint``):

entry points    cli (the ``bestofn`` command), bench/ (``python -m lab.bench``, forwards to
                the lab)
the lab         lab/: benchmarks, parity, operation counts, fault injection, probes; nothing
                below imports it
commands        workflow_glue (what the Snakemake rules call), serve (``bestofn serve``),
                ab (``bestofn ab``), remaining (``bestofn plan``), verify (``bestofn verify``)
random weights  fakes/: tiny and real-size random models in the published layouts
                (``bestofn fake-weights``, tests, the lab); nothing that runs groups imports it
worker          worker/: warm per-GPU processes, their socket protocol, the SLURM bundle feeder
plan            plan: config and sheets -> the groups, every check before any model loads
stages          pipeline (generate -> restore -> score -> write), report, trust_report, listen
                (the listening page), trust (held-out scorers, gains), selection (DuckDB tables),
                agreement (backends agree on rates and codebooks), speech (single renders),
                groupio (one group = one directory, complete or absent)
backends        backends/: one adapter per model family, chosen by name in the config
engine          moss/: our MOSS-TTS inference engines and codecs
leaves          audio, hashing, spec (what a group is), dtypes, textnorm, gpu_memory,
                torch_threads, schemas/ (the config and sheet schemas, where every default is
                written), snakemake_speedups (guarded patches of Snakemake's planning)
"""

__version__ = "0.1.0"
