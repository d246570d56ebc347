"""Warm per-slot workers: models load once per GPU and serve every group sent to that slot."""
