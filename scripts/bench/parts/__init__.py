"""The bench's parts, one module each: `--only` names them. Each part's `measure(args, env)` runs its
measures (their rows go to bench.harness) and returns its targets, (name, value, limit, ">=" or "<=")."""
