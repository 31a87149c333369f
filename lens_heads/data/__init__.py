"""Benchmarks as data: the task registry and loaders (tasks), your own records as a task (custom_tasks), the forward rows of a protocol (rows), tokenised and padded inputs (inputs)."""
