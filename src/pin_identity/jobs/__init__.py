"""Background jobs: loops over ports, no SQL and no broker client here."""
