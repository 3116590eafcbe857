"""Developer tooling (embedded services, sample data): never shipped to Spark executors."""
