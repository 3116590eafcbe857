"""What a batch tells the outside: metrics (StatsD, OpenTelemetry), OpenLineage events, and the phase timings
`make bench` reads."""
