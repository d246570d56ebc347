"""The production weights: where each backend's published checkpoint comes from (``manifest``),
fetching it under one weights root (``fetch``), the lock of its files' sizes and sha256
(``lock``), and a weights path's identity by content, never by place (``identity``)."""
