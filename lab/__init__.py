"""The lab: benchmarks, parity checks, operation counts and fault injection.

Nothing in the product imports this package (an import-linter contract in pyproject.toml checks
it). It sits above every layer: it builds the product's own objects and measures or breaks
them. Two doors lead in from outside: ``python -m lab.bench <name>`` (a forwarding shim)
and ``bestofn parity`` (the CLI imports ``bestofn.parity.local`` when that command runs).

Modules:

bench/            ``python -m lab.bench {generate,scorers,pipeline,serve,codec}``: the
                  recorded commands behind docs/PERFORMANCE.md
parity.py         ``bestofn parity``: moss-fast against the published MOSS-TTS-Local code
delay_parity.py   ``bestofn parity`` on a Delay reference folder; the published-code draws
opcount.py        kernel launches and matmuls per frame step (``python -m lab.opcount``)
probes/           one-off measurements behind single figures (Parakeet, Sidon, Delay, GEMMs),
                  each ``python -m lab.probes.NAME``
faults.py         backends that fail on purpose, plugged in by name in tests
                  (``lab.faults:FatalOnceScorer``)
"""
