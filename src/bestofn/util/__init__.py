"""Leaves: audio I/O, hashing, caches, durable writes, dtypes, text normalisation,
thread and memory settings. They import nothing else of bestofn."""
