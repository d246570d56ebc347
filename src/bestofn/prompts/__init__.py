"""`bestofn prompts import`: the emotions and prompts sheets from LAION's three public prompt
sets (docs/notes/prompt-sources.md says where each layout fact comes from)."""
