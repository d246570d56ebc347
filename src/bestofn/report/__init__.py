"""Pages over the database: throughput, the trust report, the listening page and
listeners' votes."""
