"""The database rules: the takes table, the SQL selection, and the trust tables that
check it (held-out scorers, per-group statistics)."""
