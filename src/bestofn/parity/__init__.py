"""`bestofn parity`: our MOSS engines and codec against the published reference code,
on the user's own machine."""
